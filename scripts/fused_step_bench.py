"""Micro-benchmark behind the comment in mlxlab/fused.py: one decode beside a 511-token chunk
(context 1,024), packed in one forward vs back to back, median of 7, on `small` float32.
Usage: LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python scripts/fused_step_bench.py"""
import time, random, statistics
import mlx.core as mx
from mlxlab.engine.models import load_model
from mlxlab.engine.fused import packed_forward
from mlx_lm.models.cache import make_prompt_cache
m = load_model("small", dtype="float32"); mod = m.module; V = m.vocab_size
rng = random.Random(0)
dec_p = [rng.randrange(V) for _ in range(200)]; long_p = [rng.randrange(V) for _ in range(1024 + 511)]
def setup():
    dc = make_prompt_cache(mod); mod(mx.array(dec_p)[None], cache=dc)
    cc = make_prompt_cache(mod); mod(mx.array(long_p[:1024])[None], cache=cc)
    mx.eval([c.state for c in dc + cc]); return dc, cc
chunk = mx.array(long_p[1024:])
def fused():
    dc, cc = setup(); t = time.perf_counter()
    tok = mx.argmax(packed_forward(mod, mx.array([5]), dc, [(chunk, cc)]), axis=-1)
    mx.eval(tok, [c.state for c in cc]); return time.perf_counter() - t
def unfused():
    dc, cc = setup(); t = time.perf_counter()
    tok = mx.argmax(mod(mx.array([[5]]), cache=dc)[:, -1, :], axis=-1); mx.eval(tok)
    mod(chunk[None], cache=cc); mx.eval([c.state for c in cc]); return time.perf_counter() - t
for f in (fused, unfused): f()
res = {"fused": [], "unfused": []}
for i in range(7):
    res["fused"].append(fused()); res["unfused"].append(unfused())
print({k: round(statistics.median(v)*1e3, 1) for k, v in res.items()})
