#!/usr/bin/env bash
# H200 measurement batches, one call of the device tool each:
#   run(command="bash scripts/h200_batch.sh PART", carry=[".mlxcuda"], timeout_s=600)
# Each mlxlab command runs with --save: these runs are the committed H200 results, written into
# data/results/h200/ (and paper/figures/) and copied to $OUT/h200/; the probes write there directly.
# Every line a command prints also goes to $OUT/logs/PART.log as it comes, so a call cut short
# by its time limit still brings back what ran (a scheduling study also leaves its finished runs
# in data/results/h200/scheduling_runs.jsonl, copied to $OUT/h200/).
#
# PART (what each answers; rough seconds on the H200, for the time limits):
#   engine     issue 2: bench engine, 3 presets, 9 paired repeats of 128 decode tokens (~200 s)
#   sim        issue 5: validate-sim (it measures its own profile), coder-1.5b 4-bit, 5 repeats (~300 s;
#              3 repeats took 165 s)
#   heldout    issue 19: validate-sim with 6 held-out cases (seeded random traces, chunk sizes, budgets and
#              policies off the profile grid: mlxlab.studies.sim_validation.heldout) beside the standard workloads,
#              coder-1.5b 4-bit, 3 repeats (~330 s: the standard 6 runs and 6 held-out ones per repeat, each
#              repeat after its profile share). It is the committed sim_validation.json (a superset of the
#              sim part's). HELDOUT_MODEL=qwen2.5-0.5b or llama-3.2-1b in a call of its own writes
#              sim_validation_MODEL.json (~250 s each).
#   sched      issue 3: the scheduling study, one repeat, cuDNN attention off (314 s). With cuDNN on,
#              every new (query, key) length builds a cuDNN graph: ~50 ms per chunk on first use.
#   sched_cudnn  the same study with mlx's default cuDNN attention, for the comparison (475 s)
#   slo        issue 3: the slo runs alone (references, tradeoff sweep, slo packed and not)
#   engine05   issue 2: bench engine for qwen2.5-0.5b alone, 9 paired repeats
#   rebatch    issue 5: probes/rebatch_probe.py under mlx's CUDA-graph settings: default, a larger
#              graph cache, graphs off (one process each: mlx reads them once)
#   chunks     issue 5: probes/chunk_probe.py, a chunk's cost by its exact size (2047 vs 2048, 511 vs 512)
#   decodes    issue 5: probes/decode_probe.py, a lone stream's ITL again and again between other work
#   presize    issue 5: probes/presize_probe.py, a 16k prefill with the KV cache sized up front or grown
#   align      issue 5: probes/align_ab.py, the validation workloads with aligned chunks (key_align=8) or not (1)
#   singlereq  issue 4: probes/h200_singlereq.py, warm-up per preset, KV probe and speed, prefix restores
#   limit      issue 16: bench engine with the decode-limit rows (bare loop, engine, mlx-lm at batch 1 and 8,
#              host profile per step), 3 presets, 5 repeats (~300 s)
#   exit       issue 16: probes/exit_probe.py, which uses of streams on threads exit 0 (~60 s)
#   contention issue 16: bench contention, 3 presets (a chat beside a 30k-token document); the default settings
#              are those of the committed run (the overlap ones that met or came closest to the bounds)
#   oprofile   issue 16: probes/overlap_profile.py, where the chat's and the document's time goes (~120 s)
#   determinism  issue 18: probes/determinism_probe.py, whether the same greedy requests give the same
#              tokens twice in-process (1 and 16 streams, and generate_step) on qwen2.5-0.5b (~60 s)
#   serve      issue 18: bench serve, 3 presets, 1 and 16 streams (needs the server's wheels in .whl/:
#              bash scripts/device_wheels.sh serve, then carry=[".mlxcuda", ".whl"])
#   compiled   issue 35: probes/compiled_decode_probe.py per preset (plain, masked, compiled and the mask-free
#              shapeless "prefix" step, 1,024-token context, 128 tokens, 5 repeats): whether dropping the mask
#              keeps mlx's fused one-query attention and gives back the 26-30% the mask costs (~200 s)
#   http       issue 36: export HTTP_MODEL (default qwen2.5-coder-1.5b) at 4 bits, then bench http on it:
#              mlx_lm.server and mlxlab serve (slo, interleave), 4 document workers of 16,000 tokens beside a
#              1,500-token chat streaming HTTP_CHAT_TOKENS (100) in chats one after another for HTTP_WINDOW_S (30 s),
#              2 repeats after a warm-up round, written as serve_http_MODEL.json (~450 s: mlx_lm.server's contended
#              chat runs at ~0.75 s a token; one preset a call; needs .whl/ as serve). Each finished server is kept
#              in serve_http_MODEL_partial.json until the end. On 2026-12-05 150 tokens and a 60 s window ran past
#              540 s and wrote nothing.
#   tune       issue 37: mlxlab tune --sweep at 4 bits on TUNE_MODEL (qwen2.5-coder-1.5b; then llama-3.2-1b),
#              TUNE_TRACE=recorded (the committed seed-001 scene sample, lengths x TUNE_LENGTH_SCALE=4) or
#              azure (the first 40 requests of the committed Azure sample, prompts of 1,000+ tokens as batch,
#              lengths x1), SLO TUNE_SLO (chat.itl_p99<=3x), 3 repeats: the profile, the simulated grid, the
#              confirmation and the exhaustive sweep of the grid. Measured on the H200 (2026-12-05, recorded trace,
#              coder-1.5b): profile 59 s, simulation 32 s (12 settings), confirmation 130 s (12 runs of ~11 s), then
#              3.5-5 min per sweep repeat (12 runs of 10-40 s): the call ran past 560 s in the sweep's second repeat
#              and, before --time-budget-s and --resume, wrote nothing. Now the file is written after tune and after
#              each whole sweep repeat, a repeat starts only where the slowest so far fits before T_TUNE less 40 s,
#              and TUNE_RESUME=1 in the next calls runs the missing repeats on the committed file: ~3 calls a trace
#              (commit the file between them)
#   soak       issue 41: bench soak on SOAK_MODEL (qwen2.5-coder-1.5b) exported at 4 bits, 8 minutes (one call:
#              the 10 the issue asks for do not fit beside the export and the end checks), written as
#              serve_soak_MODEL.json; needs .whl/ as serve (~600 s)
#   shapes     issue 37: probes/shape_probe.py on SHAPE_MODEL (qwen2.5-coder-1.5b) at 4 bits: what a 256-token chunk at
#              4k context costs the first time the process meets its shape (a new key length; a new size at a known
#              key length), under the default settings, cuDNN attention off, CUDA graphs off (~150 s, an estimate):
#              whether stall_free's 67-78 ms steps on the H100 are first uses, and of which cache
#   process    issue 37: probes/process_state.py on PROC_TUNE (the platform's coder chat x4 tune): its choice and the
#              sweep's best (or PROC_SETTINGS) between tune's steps in one process: start, again, profile, solo,
#              baseline, again, 2 rounds each (~530 s on the H100 with PROC_SETTINGS="stall_free-512 stall_free-1024":
#              26 runs of 14-19 s, the steps ~136 s; the file is written after each phase). PROC_SUFFIX names the
#              file; PROC_FOLLOWS (a process-state file) marks a second process after that one on the same machine
#   tail       issue 37 item 1d: probes/tail_steps.py on the platform's tune_TAIL_MODEL.json (llama-3.2-1b): its
#              interleave-4096 and admission_gate-4096 settings (TAIL_SETTINGS) on the engine, 3 repeats, and on its
#              fitted cost model, every step kept: the chat's gaps split by the steps that ended inside them (chunk or
#              decode only), with the cost model's time for the engine's own steps; then the same with the chat
#              asking TAIL_CHAT_SCALE (4) x its tokens (~4x the gaps under its p99). Two processes (~250 s each, an
#              estimate from the sweep's 10-35 s runs)
#   packed     issue 37 item 1b: probes/fused_step_bench.py on coder-1.5b at 4 bits (one decode beside a 511-token chunk
#              packed in one forward, against the two back to back; fresh caches of the same shapes every repeat, so
#              all but the first meet warm shapes), 15 repeats, cuDNN attention on (mlx's default) and off (~100 s):
#              whether a packed step costs more than its two forwards once its shapes are warm
#   apart      issue 36 item 3: probes/decode_apart_probe.py on APART_MODEL (qwen2.5-0.5b) at 4 bits, in one process:
#              a chat of 1,500 tokens streaming 256 beside back-to-back 16,000-token documents asking for 8 tokens,
#              with the documents joining its batch or decoding apart (decode_apart=4096), 5 repeats alternating,
#              and the chat alone (~150 s, an estimate: no mlx_lm.server in it)
#   encode     issue 36 item 3: probes/encode_gil_probe.py on qwen2.5-coder-1.5b at 4 bits, 5 repeats: whether
#              tokenizing posted documents in a worker process (mlxlab serve --tokenizer-processes 1) keeps the
#              chat's ITL p99 where tokenizing on the event loop does not, on a host with cores to spare (~120 s)
#   disagg2    issue 40, on the nvidia-h200-x2 kind only (two GPUs of one host): bench disagg with --gpus
#              (the one engine on GPU 0; the prefill rank on GPU 0 and the decode rank on GPU 1, KV through
#              host memory over mlx's ring backend, since its NCCL backend has no send/recv; the split
#              baseline: two independent engines, the chat on GPU 0 and the document on GPU 1), float16
#              (bfloat16 ties break greedy equality), 4-bit DISAGG_MODEL, DISAGG_DOC_TOKENS (8192, 32768,
#              131072 where the preset's context allows), 5 repeats, written to data/results/h200x2/
#              disagg_MODEL_TOKENS.json. One (preset, length) a call: 9 calls, ~300-570 s each (an estimate:
#              every repeat starts 5 processes that each build the model). Whether the ring backend moves
#              CUDA arrays at all is the first thing the first call answers (its log says).
#              run(command="DISAGG_MODEL=qwen2.5-0.5b DISAGG_DOC_TOKENS=8192 bash scripts/h200_batch.sh disagg2",
#                  carry=[".mlxcuda"], kind="nvidia-h200-x2")
#
# Left for the next GPU time, in this order (2026-12-04: none lent; 12-05: H100 http coder/llama, H200 http
# coder-1.5b, soak, encode; the recorded-trace tune ran past 560 s before it wrote as it goes; 12-05 late: two
# H100 calls, http llama-3.2-1b and qwen2.5-0.5b at eaf91dc, before the hand-out fix a2f513c; 12-06: three H200
# calls at b359155: http qwen2.5-0.5b (345 s wall) and llama-3.2-1b (237 s) after the fix, and the recorded-trace
# tune on coder-1.5b (562 s: profile 62 s, simulation 32 s, confirmation 238 s, then the sweep's first repeat was
# cut at 11 of its 12 runs by the call's limit, so the file holds tune without a sweep):
# 12-06 (#8): four H100 calls at b9b013e (no H200 came), qwen2.5-0.5b, the levers of item 2 below: the preset's
# scene (h100/serve_http_qwen2.5-0.5b.json, 306 s wall), one-token documents (209 s), slo at 2048/1024/512-token
# chunks (387 s) and the same with one-token documents (403 s), the last three as h100/http_levers_qwen2.5-0.5b_*.json
# (written as serve_http_..._SUFFIX, renamed: HTTP_NAME=http_levers_... names them so now). Found: the joins carry
# ~56% of the chat's p99 excess, chunks are a poor lever; Engine(decode_apart=N) since keeps long rows out of the batch.
# 12-06 (#9): four H100 calls at f0313ad (no H200 came; 1,570 s held): tune coder-1.5b recorded, fresh (503 s wall:
# profile 116 s, simulation 31 s, confirmation 133 s, then 15 of the sweep's 36 runs), its resume (351 s: the other
# 21 runs, then the apart probe, 20 s of runs), tune llama-3.2-1b recorded, fresh (500 s: tune 167 s, 25 runs) and
# its resume (148 s: 11 runs): h100/tune_{qwen2.5-coder-1.5b,llama-3.2-1b}.json with whole sweeps and
# h100/decode_apart_probe_qwen2.5-0.5b.json. The sweep now saves after every run and resumes mid-repeat.
# 12-06 (#10): four H100 calls at 9248b80 (no H200 came; 1,756 s held): the tunes with stall_free unpacked (cuDNN on),
# fresh, after renaming the packed H100 files to *_before_unpacked: coder-1.5b (514 s: profile 135 s, simulation 31 s,
# confirmation 190 s, 8 runs; then 481 s, the other 28) and llama-3.2-1b (530 s: tune 172 s, 25 runs; then 160 s,
# 9 runs: its sweep holds 34 of 36, interleave-256 and interleave-512 of the third repeat missing). Found: tau did not
# recover (0.60 on the objective for both, 0.75 packed); stall_free-256's chat median ITL 67-78 ms against
# interleave-256's 26-31 ms: mlx keeps one cuDNN attention graph per exact shape, and a chunk that follows the decode
# batch meets a new shape nearly every step. Since then the profile counts cold chunks by shape on that backend
# (mlxlab.engine.fused.cold_keying); a cached profile of the older rule is not reused.
# 12-06 (#11): five H100 calls (no H200 came; 1,687 s held): the llama file of #10 resumed to 35 of 36 (the shape
# probe failed in that call on an altair import, fixed in 8d61bdb); at 8d61bdb the shapes part (110 s: a new key
# length or a new size costs +66 ms on first use with cuDNN on, +4-8 ms off, +70 ms with CUDA graphs off: the cuDNN
# graph per shape), then, after renaming the H100 files to *_before_shape_cold, the shape-keyed tune of coder-1.5b
# fresh (544 s: profile 26 s, simulation 31 s, confirmation 142 s, 17 runs) and resumed (384 s, the other 19 runs:
# tau 0.84/0.84, regret 0%: rank and regret reproduced, speed 0.29x not), and llama-3.2-1b fresh (242 s: tune, 5 of
# its 36 sweep runs). The profiles fitted 58-62 ms per cold chunk.
# 12-06 (#12): three H100 calls (1,687 s held of 1,800; two failed starts cost ~350 s): at 7f893b6 llama-3.2-1b's
# shape-keyed tune resumed to its whole sweep (509 s wall, 31 runs: tau 0.78/0.96, regret 13.5% inconclusive); at
# a5b1afe, after renaming the H100 coder file to *_before_key_align, coder-1.5b fresh with the key_align grid (526 s:
# profile 121 s, confirmation 156 s, 16 runs) and resumed (254 s: a warm-up run, then the other 20): stall_free-256
# chat ITL p99 215 -> 43 ms, documents' TTFT 20.3 -> 5.4 s, chosen and the sweep's best (regret 0%), tau 0.50/0.99.
#   0. (done in one process on an H100 on 12-06 #9: joined 13.0 ms, apart 13.1 ms, no effect; the HTTP variant is
#      left: it would only say whether the server's extra lies elsewhere) decode_apart on the GPU (issue 36 item 3): HTTP_MODEL=qwen2.5-0.5b HTTP_POLICIES="slo slo:decode_apart=4096"
#      HTTP_NAME=http_levers_qwen2.5-0.5b_decode_apart (~390 s, any card: the levers files are H100's, so an H100
#      call compares best): whether 8-token documents decoding apart give the chat the one-token documents' p99.
#      Tried on 12-06 with the session's last 429 s (HTTP_WINDOW_S=20, at c5c0415): a cold machine's start took
#      ~90 s, the call was stopped at 339 s and brought back nothing (tr buffered the log; fixed, and files now
#      reach $OUT as they are written). Give it a call of its own with >= 450 s of device time; the apart part
#      (~150 s) measures the same in one process first and needs no mlx_lm.server: run it in the same session;
# 12-06 (#13): four H100 calls (1,736 s held of 1,800; two refused starts ~90 s): at 491f6fe, after renaming the H100
# llama file to *_before_key_align, llama-3.2-1b fresh with the key_align grid (539 s: tune, 17 runs) and resumed
# (244 s: the other 19): regret 37.9%, tau 0.63/0.90; at b1b4818 the tail part on llama (tail_steps, the trace and the
# chat x4, 3 repeats each) and the packed part (fused_step_bench cuDNN on/off) in one call (291 s), and the tail
# part's first process on coder-1.5b (199 s; its chat x4 process also finished). Found: the chat's p99 (#11 of 1,015
# gaps) lands on a chunk step where more than ~11 gaps meet a document's chunk, and that count follows how fast the
# chat decodes (tune now calibrates the decode cost on its solo run: mlxlab.studies.tune.calibrate).
# 12-06 (#14): two H100 calls at 47b363f (1,758 s of 1,800 spent, ~1,080 s of it on about a dozen refused or failed
# starts over an hour; no H200 came): llama-3.2-1b with the chat asking 4x its tokens and the decode calibrated, at
# TUNE_REPEATS=2 to fit what was left (476 s fresh: profile 125 s, solo 21 s, confirmation 103 s, 14 of 24 sweep runs;
# 160 s resume, warm machine: the other 10): h100/tune_llama-3.2-1b_chat_x4.json. Found: the p99 rests on ~41 of
# 4,087 gaps, yet tau on the SLO ratio fell to 0.44 (objective 0.90) and regret on it was 28%: interleave-256's
# p99 was 90 and 40 ms in its two sweep runs, while the simulated ratios of all 12 settings span only 1.6x.
# 12-06 (#15): three H200 calls at 04c390c (1,581 s of 1,800; a refused H200 start cost 181 s): coder-1.5b with the chat
# asking 4x, fresh (508 s wall: profile 135 s, solo 25 s, confirmation 179 s, 8 of 22 sweep runs) and resumed (268 s, warm:
# the other 14), then llama-3.2-1b the same, fresh (446 s: tune and the whole sweep of 22 runs in one call):
# h200/tune_{qwen2.5-coder-1.5b,llama-3.2-1b}_chat_x4.json with whole 2-repeat sweeps. The grid's slo-4096 ran as slo-2048's
# schedule in the simulation, so tune swept 11 settings. Found: coder's choice stall_free-256 (1.08x at the median) cost
# 17x stall_free-1024's objective, which the sweep measured at the same ratio (0.96-0.97x): tune's choice rule now takes the
# best objective within the closest setting's worst repeat. The old H200 coder file (old grid, no sweep) was renamed
# tune_qwen2.5-coder-1.5b_before_unpacked.json.
# 12-06 (#16): no machine came: 23 calls for an H200 or an H100 from 23:12 to 00:39 UTC (about 13 failed starts of ~90 s,
# 10 refused at once at 15 s) spent 1,516 s of the 1,800. Ready for the next calls: TUNE_TIME_SCALE (the Azure trace at 0.5: arrivals twice as dense, each
# run ~12 s), the kernel cache brought back as $OUT/mlx-ptx.tar.xz (copy it to .mlxcuda/mlx-ptx.tar.xz: the next
# fresh machine skips the ~85 s of NVRTC compiles), the profile's warm-up over every decode batch size (0decd22).
# 12-07 (#17): no machine came again: 19 calls for an H200 (15) or an H100 (4) from 01:31 to 03:19 UTC, 10 of them failed
# starts (90-180 s each) and 9 refused at once (15 s), spent 1,486 s of the 1,800. The plan below is unchanged; tune now
# races its confirmation (--repeats a ceiling; H200 calls at TUNE_REPEATS=2 cannot stop early) and has --grid full
# (TUNE_GRID=full: 30-33 settings; on the H200's traces ~3 calls a model at 2 repeats).
# 12-07 (#18): asked for an H200 from 03:59 UTC; after 8 failed or refused tries (~600 s) an H100 came at 04:32 (kept
# warm, 4 calls, 1,766 s of 1,800 spent): at 7c79beb the imported trace (TUNE_TRACE=azure TUNE_TIME_SCALE=0.5
# TUNE_REPEATS=2) on llama-3.2-1b, fresh (530 s: profile 125 s, solo 26 s, confirmation 117 s, 16 of 18 sweep runs)
# and resumed (63 s, the other 2): h100/tune_azure_llama-3.2-1b.json, interleave-4096, regret 0.0%, tau 0.56/0.83,
# speed 1.09x (a fresh machine measures the profile); then coder-1.5b fresh (408 s: 12 of 18 sweep runs) and resumed
# (91 s with the 138 s left: 3 more): h100/tune_azure_qwen2.5-coder-1.5b.json at 15 of 18 runs.
# 12-07 (#19): from 06:13 to 07:42 UTC 19 calls for an H200 (2 for an H100), 14 of them failed starts (90-105 s each)
# and 4 refused at once (15 s); the last, at 07:42 with 314 s left, got an H100 at 7ce486e: the coder azure resume
# (168 s wall) spent 139 s warming a cold process (NVRTC compiles) and ran none of its 3 runs (file unchanged, not
# committed). Its kernel cache is now committed as scripts/mlx-ptx.tar.xz (unpacked on any fresh machine). The plan
# below is unchanged.
# 12-07 (#20): an H100 came at once (08:21 UTC) and stayed warm: six calls at 8d57a87, 1,679 s of 1,800: coder azure resumed
# (97 s wall: its last 3 runs, a 21 s warm-up with the committed kernel cache against 139 s cold), coder chat x4 fresh (539 s:
# tune 235 s, 15 of 22 sweep runs) and resumed (156 s), a third sweep repeat for coder chat x4 (218 s), llama chat x4 (198 s)
# and both azure files (318 s + 47 s): h100/tune_azure_{qwen2.5-coder-1.5b,llama-3.2-1b}.json and the _chat_x4 pair now hold
# 3-repeat sweeps (the chat x4 tunes' confirmations stayed at 2). Found: coder chat x4's confirmation ran each stall_free
# candidate once 1.19-1.45x above every sweep run (and once below them), on the H200 file too (probes/confirm_cold.py):
# tune now warms each candidate up once before confirming on such a device (--warm-up auto) and keeps each run's ratio.
# 12-07 (#21): an H100 again (10:27 UTC), five calls at dcd06e8, 1,726 s of 1,800: coder chat x4 fresh (545 s) + resume
# (199 s) + a third sweep repeat (249 s): the new h100/tune_qwen2.5-coder-1.5b_chat_x4.json (the earlier one kept as
# *_before_repeat_ratios.json). --warm-up auto did NOT warm up (a bug, fixed in 43e3342): its repeat_ratios show each
# candidate's first repeat 1.3-2.2x its second; its solo chat p99 was 36.7 ms against 22.4 and 24.3 in the other two
# tunes (the solo runs now warm up too). Then TUNE_STEADY=1 on coder chat x4: fresh (521 s; confirmation warmed up,
# repeats within 0.87-1.07x of each other) and a 106 s resume: 8 of 22 steady sweep runs stored.
#   Tune now also takes at least 5 solo runs (SOLO_REPEATS; 2 before): ~3 more runs of ~14 s on coder-1.5b per fresh tune.
# 12-07 (#22): the first try (an H200 or an H100, 12:41 UTC) found no machine (181 s); an H100 (named) came at once: three
# calls at 9bcd38a, 1,597 s of 1,800 in all: the steady sweep finished (427 s: 14 runs, h100/tune_qwen2.5-coder-1.5b_chat_x4
# _steady.json, 2 whole repeats: choice stall_free-512 met, stall_free-1024 met at 0.69 in the sweep and missed at 1.08 in
# the confirmation: regret 641%); coder chat x4 with the working warm-up, fresh (527 s: solo 14.2 ms, 5 runs 13.1-16.4,
# "after a run not kept"; confirmation "warmed the process up", 82 s; 10 of 22 sweep runs) and a TUNE_REPEATS=3 resume
# (412 s: 23 runs): h100/tune_qwen2.5-coder-1.5b_chat_x4.json with 3 whole repeats (the cold one kept as
# *_before_warm_up.json): no setting meets 3x the warm solo, regret 8.3% on the binding ratio, tau 0.93 obj / 0.67 SLO.
# Found (probes/sweep_processes.py over stored files): 14 of 16 settings ran slower in tune's own process (profile, solo,
# confirmation) than in the resumed calls (median 1.18x on the SLO ratio); the baseline before a run is not it
# (probes/confirm_order.py). The fresh call's profile is committed as data/profiles/tune/h100/ (TUNE_CACHED_PROFILE=1).
# 12-07 (#23): the first try (kind nvidia-h200, 15:04 UTC) found no machine (~90 s); an H100 (named) came at once: four
# calls at 6e08d31, ~1,720 s of 1,800: coder chat x4 with TUNE_CACHED_PROFILE=1, fresh (541 s: "profile from the cache",
# solo 11.2 ms, 13 sweep runs) and a TUNE_REPEATS=3 resume (333 s): h100/tune_qwen2.5-coder-1.5b_chat_x4_cached_profile.json,
# 3 whole repeats: choice stall_free-256 = sweep best (regret 0.0% on the binding ratio, no setting meets), tau 0.96 obj /
# 0.89 SLO. probes/sweep_processes.py: 8 of 11 settings still slower in tune's process, median 1.05x (1.17x with the
# profile in it); a setting's first run in a resumed process is not slower than its run after itself (8 of 18, 1.00x).
# Then the steady experiment with a warm solo and the cached profile, fresh (488 s: solo 9.5 ms, decode calibrated
# 2.65 -> 4.09 ms; 6 sweep runs) and a short resume (147 s: 10 of 22 sweep runs stored):
# h100/tune_qwen2.5-coder-1.5b_chat_x4_steady_cached_profile.json (its confirmed objective within 4% of the simulation).
# 12-07 (#24): from 17:39 UTC no machine came for 45 minutes (starts tried on both kinds, ~90-100 s each, and refusals
# of 15 s: 886 s of the 1,800 were gone before a call ran); at 18:25 an H200 came: two calls at
# ee8118c. (1) process, PROC_SETTINGS="stall_free-512 stall_free-1024" T_PROC=530 on h200/tune_qwen2.5-coder-1.5b_chat_x4
# .json (535 s; its runs took ~23 s on the H200, so the limit stopped it after 4 of 6 phases: start, again, profile,
# solo): the objective rose 1.03x, 1.15x, 1.13x phase on phase with or without a step, ITL p50 1.12x at the end, a
# setting's two runs in a phase up to 1.39x apart: h200/process_state_qwen2.5-coder-1.5b.json. (2) on the same warm
# machine, PROC_ROUNDS=1 PROC_PHASES="start baseline again" PROC_SUFFIX=_baseline (run then as the probe's own command,
# 256 s): its first phase ran ITL p50 at 0.98x the first process's last phase and 1.10x its first (the objective 1.39x):
# the new process began where the old one ended, so what slows the runs outlives the process (the card or the machine,
# not a step of tune's): h200/process_state_qwen2.5-coder-1.5b_baseline.json. Calls now log the GPU's clocks,
# temperature, power and throttle reasons every 5 s ($OUT/logs/gpu_PART.csv).
# 12-08 (#28): no call ran (the device tool lent no machine this session). Found on the CPU: #27's "decode-only steps
#    2.2-3.6x the cost model" was the probe's error: a pipelined decode-only step's record ends when the next step
#    reads its tokens, so its span covers two forwards; tail_steps now times each step from the previous one's end
#    (own_times, the profile's measure). On #27's files engine against simulation, both spans: decode-only steps
#    1.10-1.88x, the chat's decode gaps 8.6-15.5 ms against 6.7-8.5: the H100's decode forwards beside the documents
#    do cost more than priced. On the CPU (cpu/tail_steps_small_chat_x8.json) own time over the model: 1.02-1.26x.
#   next (any card, 1 call, ~400 s): the #27 tail item again with the fixed probe (files gain "step_time": "own",
#      span_p50_s and decode_steps): TAIL_MODEL=qwen2.5-coder-1.5b
#      TAIL_TUNE=tune_qwen2.5-coder-1.5b_chat_x4_steady_cached_profile TAIL_CHAT_SCALE=1 TAIL_REPEATS=2 T_TAIL=300 with
#      TAIL_SETTINGS "stall_free-512 stall_free-1024" (TAIL_LABEL=chat_x4_steady), "interleave-512 interleave-1024"
#      (chat_x4_steady_interleave), "slo-2048 admission_gate-2048" (chat_x4_steady_slo_gate): the same names replace
#      #27's files, which the paper then reads by own time.
#   then (H200): the #26 entry's clock item, then the items below from "the imported trace on the H200" on.
# 12-08 (#27): 3 calls on one H100 (00:12-01:20 UTC: 8 starts failed or were refused, ~90 s each; one came at
#    01:20 for the nvidia-h200 kind and gave an H100; budget then 1,064 s, so no H200 item would have fit). The tail part
#    on the steady cached-profile file, 2 repeats, one process each: stall_free-512/1024 (137 s), interleave-512/1024
#    (111 s), slo-2048 and admission_gate-2048 (114 s), written as tail_steps_qwen2.5-coder-1.5b_chat_x4_steady*.json
#    (TAIL_TUNE, TAIL_LABEL, TAIL_CHAT_SCALE=1 are new). Chunk steps beside decode rows measured 1.05-1.29x the cost
#    model's time on the same steps; steps with decode rows only 2.2-3.6x (16-31 ms), while the chat's own decode gaps
#    stayed lower: the underpriced steps are the documents decoding without the chat.
#   next (any card, 1 call): keep each step's rows and context in tail_steps (a --keep-steps flag) and run the same
#      three settings pairs again, to see which rows and contexts the slow decode-only steps hold.
#   then (H200): the #26 entry's H200 clock item, then the items below from "the imported trace on the H200" on.
# 12-07 (#26): 2 calls on an H100 (starts failed or were refused 21:58-22:20; one came at 22:23). 1) the process item
# below with the GPU log: the SM clock held 1,980 MHz, 46-51 C, no throttle reason, while stall_free-512's ITL p50
# rose 15.6 -> 21.1 ms over the phases; the second process began at 15.4 ms: on the H100 the slowdown stays with the
# process (#24's H200 pair said it outlived it). 2) the steady cached-profile file is whole (regret 0.0%). Budget
# left 441 s: a fresh start would spend most of it, so nothing more ran.
#   next (H200, 1 call): the same process item on the H200, where #24 found the slowdown outlived the process: export
#      PROC_SETTINGS="stall_free-512 stall_free-1024" PROC_ROUNDS=1; PROC_SUFFIX=_clocks T_PROC=330 ... process;
#      PROC_SUFFIX=_clocks_again PROC_PHASES="start again" T_PROC=180 PROC_FOLLOWS=data/results/h200/...clocks.json
#      ... process; then probes.gpu_clocks --save on both.
#   then: the items below from "the imported trace on the H200" on (H200), the tail probe (H100), #39's list.
# 12-07 (#25): no call ran. From 19:40 to 20:32 UTC every start failed or was refused (failed starts ~90 s, one machine
# taken back mid-start 237 s, refusals 15 s), then the device tool said no machine is lent for the rest of the session:
# ~1,030 s of the 1,800 spent on starts. Made ready for the next call: process_state keeps each run's and phase's UTC
# start and wall; the GPU log runs in UTC, appends (two processes of one part share it) and logs GPU use; after the
# call run `python -m probes.gpu_clocks data/results/PLAT/process_state_qwen2.5-coder-1.5b_clocks.json
# data/results/PLAT/logs_DATE/gpu_process.csv --save` (and the same on the _again file): per run its clocks,
# temperature, power and throttle reasons, and the Spearman link of its ITL with its SM clock; the paper says it.
#   next (any card, 1 call, ~560 s; the item below with the suffixes that keep #24's files): export
#      PROC_SETTINGS="stall_free-512 stall_free-1024" PROC_ROUNDS=1; PROC_SUFFIX=_clocks T_PROC=330 bash
#      scripts/h200_batch.sh process; PROC_SUFFIX=_clocks_again PROC_PHASES="start again" T_PROC=180
#      PROC_FOLLOWS=data/results/$MLXLAB_PLATFORM/process_state_qwen2.5-coder-1.5b_clocks.json bash
#      scripts/h200_batch.sh process (on an H200 runs take ~23 s: the first process may stop after 4-5 phases).
#   next (any card, 1 call): the same two processes with the GPU log, to see whether the card slows (clocks, throttle
#      reasons) as the runs do: PROC_SETTINGS="stall_free-512 stall_free-1024" PROC_ROUNDS=1 T_PROC=300 process, then
#      PROC_SUFFIX=_again the same (one call: `... process; PROC_SUFFIX=_again ... process`). If the clocks fall, the
#      sweep's and confirmation's order in time, not tune's process, is what set them apart (sweep_processes).
#   then the items below from "finish the steady file" on.
#   done in #24: the process item below (4 of its 6 phases, and the baseline in a second process).
#   next (any card, 1 call, ~500 s): bash scripts/h200_batch.sh process (probes/process_state.py): which of tune's steps
#      (profile, solo runs, BatchGenerator) leaves the engine slower, measured in one process with drift phases.
#   next (any card, ~1 call): finish the steady file: TUNE_STEADY=1 TUNE_CACHED_PROFILE=1 TUNE_CHAT_SCALE=4 TUNE_REPEATS=2 T_TUNE=560
#      TUNE_MODEL=qwen2.5-coder-1.5b (no TUNE_FRESH: it resumes; 12 runs of ~28 s and a warm-up).
#   then (any card): the remaining items below from "then (any card): the steady experiment again" on (its first call is
#      the one above), the H200 items first where an H200 comes.
#   done in #23 (the item below, and the first call of the one after it):
#   next (any card; the experiment that says whether the profile is the cause, ~2 calls): TUNE_CACHED_PROFILE=1
#      TUNE_FRESH=1 TUNE_CHAT_SCALE=4 TUNE_REPEATS=2 T_TUNE=560 TUNE_MODEL=qwen2.5-coder-1.5b (writes
#      tune_qwen2.5-coder-1.5b_chat_x4_cached_profile.json; on an H200 it fails: no committed H200 profile yet, run it
#      without TUNE_CACHED_PROFILE once and commit $OUT/profiles/ to data/profiles/tune/h200/), then a TUNE_REPEATS=3
#      resume (same variables, no TUNE_FRESH); then probes/sweep_processes.py: whether tune's process still runs slower.
#   then (any card): the steady experiment again with a warm solo (h100/..._steady.json calibrated its decode on a cold
#      solo at dcd06e8: every simulated figure 1.2-2.2x the sweep's): TUNE_STEADY=1 TUNE_CACHED_PROFILE=1 TUNE_FRESH=1
#      TUNE_CHAT_SCALE=4 TUNE_REPEATS=2 T_TUNE=560 (writes *_chat_x4_steady_cached_profile.json beside it), ~2 resumes.
#   done in #22: finish the steady file; coder chat x4 with the working warm-up (the two items below).
#   next (any card): finish h100/tune_qwen2.5-coder-1.5b_chat_x4_steady.json: TUNE_STEADY=1 TUNE_CHAT_SCALE=4
#      TUNE_REPEATS=2 T_TUNE=560 TUNE_MODEL=qwen2.5-coder-1.5b (no TUNE_FRESH: it resumes; each setting runs twice a
#      process, ~30 s a pair: ~14 pairs left, ~2 calls); on an H200 write its own file (the same, with TUNE_FRESH=1 first).
#   next (any card): coder chat x4 with the warm-up that now works: rename h100/tune_qwen2.5-coder-1.5b_chat_x4.json to
#      *_before_warm_up.json, then TUNE_FRESH=1 TUNE_CHAT_SCALE=4 TUNE_REPEATS=2 T_TUNE=560 and a resume (the log must
#      say "after a run not kept" for the solo and "warmed the process up" for the confirmation).
#   later (H100): why the simulator puts stall_free's chat p99 ~1.35x above the warm engine's (the steady file: 77 ms
#      simulated, 57 ms measured for stall_free-512): TAIL_MODEL=qwen2.5-coder-1.5b TAIL_SETTINGS="stall_free-512
#      stall_free-1024" bash scripts/h200_batch.sh tail (engine and cost model step by step, chat x1 and x4; ~2 x 250 s).
#   then (any card; an experiment, ~3 calls a model): TUNE_STEADY=1 TUNE_CHAT_SCALE=4 TUNE_REPEATS=2 TUNE_FRESH=1 T_TUNE=560
#      (writes tune_MODEL_chat_x4_steady.json; then resumes): every kept run warm and the simulation on second runs, so
#      tau compares like with like; the sweep's warm-ups double a resume call's cost. Whether tau and regret then hold.
#   next (any card): coder chat x4 again with the confirmation warmed up (rename h100/tune_qwen2.5-coder-1.5b_chat_x4.json
#      to *_before_warm_up.json, then TUNE_FRESH=1 TUNE_CHAT_SCALE=4 TUNE_REPEATS=2 T_TUNE=560 and a resume): whether the
#      choice then meets the SLO the sweep says stall_free-512 meets; on an H200 the plan below, (a) first.
#   next (H200), in this order: (a) the imported trace, one call a model at 2 repeats:
#      TUNE_TRACE=azure TUNE_TIME_SCALE=0.5 TUNE_REPEATS=2 TUNE_FRESH=1 T_TUNE=550 TUNE_MODEL=llama-3.2-1b (~500 s, an
#      estimate: profile ~100 s on a fresh machine, solo and confirmation ~120 s, 22 sweep runs of ~12 s), then
#      TUNE_MODEL=qwen2.5-coder-1.5b the same (fresh, then a resume call without TUNE_FRESH); (b) then the item below.
#   next (H200): the two chat x4 tunes again (TUNE_CHAT_SCALE=4), after renaming each h200/tune_MODEL_chat_x4.json to
#      *_before_warm_up.json, so the choice rule of 12-06 #15 and the confirmation's warm-up (12-07 #20) run on the engine
#      (TUNE_FRESH=1 T_TUNE=560 at TUNE_REPEATS=2, then a resume, then a TUNE_REPEATS=3 resume for a third sweep repeat:
#      ~3 calls a model; the warm-up adds one run per confirmed setting, ~80 s); or with TUNE_GRID=wide (writes
#      tune_MODEL_chat_x4_wide.json, no rename; 19 settings: ~2 calls a model at 2 repeats); then #39's list. (On an H100
#      coder-1.5b chat x4 ran in 12-07 #20.)
#   1. (next on an H100) coder-1.5b the same (llama's is done: TUNE_REPEATS=2 fits a fresh call and a short resume; 3 repeats
#      need ~2-3 calls). Then: why one setting's chat p99 moves 2x between runs at ~41 gaps (tail part with
#      TAIL_CHAT_SCALE=4 on interleave-256 and interleave-512, whose runs parted most).
#      Earlier text: tune with the chat asking 4x its tokens, so the SLO's p99 rests on ~43 gaps, and the decode calibrated
#      (both new since 12-06 #13): TUNE_FRESH=1 TUNE_CHAT_SCALE=4 T_TUNE=560 TUNE_MODEL=qwen2.5-coder-1.5b bash
#      scripts/h200_batch.sh tune (writes tune_MODEL_chat_x4.json: no rename needed), then resume calls (TUNE_CHAT_SCALE=4
#      again; its runs are longer than the plain trace's: ~2-3 calls); then llama-3.2-1b the same. Any card; on the
#      H200 first its old file (old grid, no sweep) is renamed to tune_qwen2.5-coder-1.5b_before_unpacked.json and the
#      plain trace tuned fresh as well. Earlier text of this item (done on H100s through 12-06 #13):
#      on an H100, llama-3.2-1b with the key_align grid
#      as coder's (rename h100/tune_llama-3.2-1b.json to *_before_key_align.json, then TUNE_FRESH=1 and a resume
#      call, ~800 s). On the H200 (its file has the old grid and rule): TUNE_FRESH=1 coder-1.5b, then resume calls; then llama-3.2-1b the
#      same. Earlier text of this item:
#      tune on coder-1.5b recorded with its sweep, FRESH (TUNE_FRESH=1 in the first call, T_TUNE=560): since 12-06 #9
#      tune's grid runs stall_free unpacked on CUDA with cuDNN on (mlxlab.engine.fused.packs_well), the fix for the
#      rank claim that the H100 files (packed stall_free, tau 0.29-0.57 on the SLO ratio) measured before it; the
#      committed H200 file has the old grid. Then resume calls (no TUNE_FRESH) until 3 whole repeats (36 runs of
#      10-35 s on an H100; ~23 runs fit a 560 s call): ~3 calls; commit the file between calls. On an H100 the same
#      with the H100 file first renamed to named history (tune_MODEL_before_unpacked.json). The tune part resumes by itself where the platform's file exists (TUNE_FRESH=1
#      runs tune anew), so one command serves an H200 (resume) and an H100 (a fresh tune there, or its resume). Also on the H200:
#      llama-3.2-1b recorded (fresh ~500 s + resume ~150 s, as on the H100);
#   1d. (done on an H100, 12-06 #13: `tail`, h100/tail_steps_*.json; left: the timelines tail_steps keeps since, for
#      which documents meet which chats) why the chat's tail is mis-simulated where documents are prefilled in large chunks
#      (interleave-4096 and admission_gate on the H100 files: the chat's ITL p99 measured 6-20 ms against 44 ms
#      simulated on llama-1b, 86-143 against 58 ms on coder-1.5b): the engine's per-step records of those runs
#      (validate-sim keeps steps; tune's sweep keeps summaries only), and a recorded trace with more of the chat's
#      tokens, so the SLO's p99 rests on more than ~10 gaps (tune prints how many: slo_samples);
#   1c. (done for coder-1.5b on an H100, 12-06 #12: the remedy holds on the engine; llama is item 1) the remedy the shape-keyed cost model points at: since 12-06 #11 tune's
#      grid on such a device runs stall_free with key_align = half its budget (its chunks end on few key lengths,
#      so shapes repeat). probes/key_align_sim.py on the H100 tune files predicts a lower chat ITL p99 at every
#      budget. To measure it: rename the platform's tune_qwen2.5-coder-1.5b.json to *_before_key_align.json, then
#      TUNE_FRESH=1 T_TUNE=560 TUNE_MODEL=qwen2.5-coder-1.5b bash scripts/h200_batch.sh tune, and resume calls;
#   1a. (done on an H100, 12-06 #11: the shape rule is right) `bash scripts/h200_batch.sh shapes`: if a new key length
#      costs tens of ms with cuDNN on and not off, the shape rule is right and its cost term should be large;
#      if a new size costs it and a new key does not, the size rule was right and the cause lies elsewhere
#      (then CUDA graphs: compare graphs_off);
#   1b. (done on an H100, 12-06 #13: `packed`; packed 17.6 ms against 20.3 ms as two forwards with cuDNN on, 23.2
#      against 26.0 off; left: a sweep with stall_free packed and key_align, to see whether packs_well can say yes there)
#      why a packed step is slow with cuDNN attention: the shapes probe (12-06 #11) says a new attention shape costs
#      ~66 ms on first use, which a packed step meets as an unpacked one does; left: a packed stall_free step with
#      cuDNN on and off at a repeated shape, to see whether packing costs anything beyond the shapes (then
#      packs_well could say yes again on CUDA);
#   2. (done on an H100 on 12-06, see above) the levers on the chat's p99 (issue 36 item 3): HTTP_MODEL=qwen2.5-0.5b
#      HTTP_POLICIES="slo slo:chunk_size=1024 slo:chunk_size=512" (~400 s): the chat's ITL p99 over its solo p99
#      against the documents/min each costs (the target allows 10% below the best); and the same scene with the
#      documents asking for one token (HTTP_DOC_TOKENS=1 HTTP_SUFFIX=_doc_tokens_1, a call of its own): a
#      one-token request never joins the decode batch, so if the p99 band (25-58 ms on 1-2% of the chat's gaps)
#      is the documents' first tokens and joins beside the chat (~4.6 a second at 277 documents/min, against
#      ~175 chat gaps a second: 2.6%), it goes with them;
#      Five repeats (issue 39) do not fit one call: run a preset's scene in parts at one commit (HTTP_REPEATS=3
#      HTTP_SUFFIX=_part2 after a 2-repeat call), then pool them here with `mlxlab bench http --merge
#      data/results/h200/serve_http_M.json data/results/h200/serve_http_M_part2.json --name serve_http_M --save`
#      (it refuses parts of another commit, device or scene);
#   3. http coder-1.5b on the H200 again (HTTP_POLICIES=slo; its committed file predates the tokenizer-process
#      default, the shortest-first order and the hand-out fix; ~450 s);
#   4. tune azure on coder-1.5b and recorded on llama-1b (each a tune call, then resume calls), compiled, then
#      issue 39's plan below.
# Each try that gets no machine costs 90-250 s of device time: wait the time the refusal names. Start each call with
#   export MLXLAB_PLATFORM=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
# since a call for nvidia-h200 may get an H100. After an http call: copy $OUT/PLAT/serve_http_*.json into
# data/results/PLAT/, `mlxlab bench http --rescore data/results/PLAT/FILE --save` (its figure) and
# `mlxlab paper --readme` (the README's headline table).
#
# The defaults are five repeats (issue 20: every timing the paper quotes), except where one call
# cannot hold five. What was still under five on 2026-12-03, as calls of at most ~570 s (estimates
# from the three-repeat runs' wall times; the device budget had ~80 s left, so none was run):
#   contention                     ~400 s   h200/contention.json (3 -> 5 repeats)
#   heldout                        ~520 s   h200/sim_validation.json (3 -> 5; held-out seed 2 as committed)
#   chunks; presize (one call)     ~210 s   h200/chunk_probe.json, presize_probe.json
#   align                          ~300 s   h200/align_ab.json
#   oprofile                       ~270 s   h200/overlap_profile.json (6 runs, the first dropped: 5 kept)
#   slo with SLO_ARGS="--repeats 5" T_SLO=450 (the --repeats given last wins)   ~350 s   h200/scheduling_slo.json
#   sched_cudnn and the slo grid-256 variant: 5 repeats do not fit one call; run them as parts with
#   --keep-runs --name NAME_partK and pool them with `mlxlab bench scheduling --merge PARTS --name NAME
#   --save` (as h200/scheduling.json was: scheduling_parts/), ~475 s per cuDNN repeat.
#   The per-preset warmup_memory files: `mlxlab reproduce --only 04 --platform h200 --save` with
#   --param "models=[PRESET]" --param bits=4 (cold_repeats now 5), one call per preset.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?give a PART: engine | engine05 | sim | heldout | sched | sched_cudnn | slo | singlereq | rebatch | chunks | decodes | presize | align | limit | exit | contention | oprofile | serve | determinism | compiled | http | tune | disagg2 | encode | soak | apart | tail | packed}
H="bash scripts/h200.sh"
# the results folder: h200, or MLXLAB_PLATFORM=h100 for a call that got an H100 (the same sm_90 bundle runs there)
PLAT=${MLXLAB_PLATFORM:-h200}
export MLXLAB_PLATFORM=$PLAT
LOG=${OUT:-/tmp}/logs/$part.log
MARK=$(mktemp) && touch "$MARK"
mkdir -p "$(dirname "$LOG")"
run() {
  echo "== $*" | tee -a "$LOG"
  # sed -u, not tr: tr buffers into a pipe, so a call killed at its limit brought back an empty log (2026-12-06)
  timeout "${T:-300}" "$@" 2>&1 | sed -u 's/\r/\n/g' | grep --line-buffered -v 'it/s\]$' | tee -a "$LOG" | tail -40
}
if [ -n "${OUT:-}" ]; then
  # what the commands have written so far (a *_partial.json per finished server, a tune file per sweep repeat)
  # goes to $OUT every 20 s: a call the device tool stops at its limit skips the copy at the end
  ( while sleep 20; do
      mkdir -p "$OUT/$PLAT" && [ -d "data/results/$PLAT" ] &&
        find "data/results/$PLAT" -maxdepth 1 -type f -newer "$MARK" -exec cp {} "$OUT/$PLAT/" \;
    done ) >/dev/null 2>&1 &  # not on the call's stdout: its last sleep must not hold the output open
  COPIER=$!
  # the GPU's clocks, temperature, power, use and throttle reasons every 5 s (times in UTC, as the probes keep
  # theirs), beside the call's log: on 2026-12-07 #24 a second process on the same H200 began as slow as the first
  # had ended (probes/process_state.py), so what slowed the runs outlived the process; this says whether the card
  # itself slowed (clocks, throttling) while a call ran
  GPULOG=
  if command -v nvidia-smi >/dev/null 2>&1; then
    TZ=UTC nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,clocks_throttle_reasons.active \
      --format=csv -l 5 >> "$OUT/logs/gpu_$part.csv" 2>/dev/null &
    GPULOG=$!
  fi
  trap 'kill $COPIER $GPULOG 2>/dev/null' EXIT
fi
# probes run on the mlx bundle (scripts/h200.sh unpacks it the same way for mlxlab commands)
[ -d .mlxcuda/site/mlx ] || { mkdir -p .mlxcuda/site && tar xJf .mlxcuda/mlx-cuda-sm90.tar.xz -C .mlxcuda/site; }
# mlx's CUDA backend compiles each kernel variant with NVRTC on its first use and keeps the result under
# TMPDIR/mlx/VERSION/ptx: on a fresh machine that took ~85 s of the first profile's warm-up (2026-12-06,
# coder-1.5b; 3 s on a machine that had run a model before). A call brings that folder back as
# $OUT/mlx-ptx.tar.xz; carried as .mlxcuda/mlx-ptx.tar.xz, or committed as scripts/mlx-ptx.tar.xz (a new
# session's machine has no .mlxcuda of the last one: on 2026-12-07 a resume call's warm-up run took 139 s on a
# fresh H100 and left no time for its 3 runs), it is unpacked where mlx looks before anything runs; kernels of
# another mlx version sit under their own version's folder and are not used. Copy each call's cache over the
# committed one. No MLX_* variable changes, so results keep their provenance; cuDNN's per-shape attention
# graphs are still built in each process (they are not in that folder).
TMPD=$(python3 -c 'import tempfile; print(tempfile.gettempdir())')
PTX=.mlxcuda/mlx-ptx.tar.xz; [ -f "$PTX" ] || PTX=scripts/mlx-ptx.tar.xz
if [ -f "$PTX" ] && [ ! -d "$TMPD/mlx" ]; then tar xJf "$PTX" -C "$TMPD" || true; fi
PY="env PYTHONPATH=.mlxcuda/site:. MLXLAB_PLATFORM=$PLAT PYTHONUNBUFFERED=1 python3"
M="--model qwen2.5-coder-1.5b --bits 4"
case "$part" in
  engine)
    T=${T_ENGINE:-420} run $H bench engine --save --models qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b --bits 4 \
      --prompt-tokens 4096 --decode-tokens 128 --repeats 9 ;;
  sim)
    export MLX_CUDA_USE_CUDNN_SDPA=0  # no per-shape cuDNN graph builds in the step times the fit sees
    T=${T_SIM:-480} run $H validate-sim --save --model qwen2.5-coder-1.5b --bits 4 --scale 8 --chunk-size 2048 --repeats ${SIM_REPEATS:-5} ;;
  heldout)
    export MLX_CUDA_USE_CUDNN_SDPA=0  # as sim: no per-shape cuDNN graph builds in the step times
    hm=${HELDOUT_MODEL:-qwen2.5-coder-1.5b}
    hn=$([ "$hm" = qwen2.5-coder-1.5b ] && echo sim_validation || echo "sim_validation_$hm")
    T=${T_HELDOUT:-570} run $H validate-sim --save --model "$hm" --bits 4 --scale 8 --chunk-size 2048 \
      --repeats ${HELDOUT_REPEATS:-5} --held-out ${HELDOUT_N:-6} --held-out-seed ${HELDOUT_SEED:-2} --name "$hn" ;;
  sched)
    export MLX_CUDA_USE_CUDNN_SDPA=0
    T=540 run $H bench scheduling --save --model qwen2.5-coder-1.5b --bits 4 --repeats 1 --workers 1 2 4 \
      --chunk-sizes 512 1024 2048 ;;
  sched_cudnn)
    T=540 run $H bench scheduling --save --model qwen2.5-coder-1.5b --bits 4 --repeats 1 --workers 1 2 4 \
      --chunk-sizes 512 1024 2048 --name scheduling_cudnn ;;
  slo)
    # the slo runs alone (slo's rule for an unreachable target, infeasible_efficiency, is new) and
    # the study warms every contention executor up first
    export MLX_CUDA_USE_CUDNN_SDPA=0
    T=${T_SLO:-300} run $H bench scheduling --save --model qwen2.5-coder-1.5b --bits 4 --repeats 1 --workers 1 \
      --chunk-sizes 512 1024 2048 --policies slo --name scheduling_slo ${SLO_ARGS:-} ;;
  engine05)
    # the one preset whose ratios the 5-repeat run left unsettled, alone, 9 paired repeats
    T=${T_ENGINE:-300} run $H bench engine --save --models qwen2.5-0.5b --bits 4 --prompt-tokens 4096 \
      --decode-tokens 128 --repeats 9 --name bench_engine_qwen2.5-0.5b ;;
  rebatch)
    export MLX_CUDA_USE_CUDNN_SDPA=0 MLX_PTX_CACHE_DIR=.mlxcuda/ptx_cache  # later processes reuse the JIT cache
    P="$PY -m probes.rebatch_probe $M"
    T=200 run $P --label default
    T=120 run env MLX_CUDA_GRAPH_CACHE_SIZE=4000 $P --label graph_cache_4000
    T=120 run env MLX_USE_CUDA_GRAPHS=0 $P --label graphs_off ;;
  chunks)
    # one chunk forward by its exact size (round, and a token or two off), at 0 and 8k context
    export MLX_CUDA_USE_CUDNN_SDPA=0
    T=${T_CHUNKS:-240} run $PY -m probes.chunk_probe $M --repeats ${REPEATS:-5} ;;
  shapes)
    # what a chunk's first use of a shape costs (a new key length, a new size), under mlx's default backend
    # settings, with cuDNN attention off, and with CUDA graphs off: one process each (mlx reads them once)
    m=${SHAPE_MODEL:-qwen2.5-coder-1.5b}
    P="$PY -m probes.shape_probe --model $m --bits 4 --tokens ${SHAPE_TOKENS:-256} --context ${SHAPE_CONTEXT:-4096}"
    T=150 run $P --name "shape_probe_$m" --label default
    T=150 run env MLX_CUDA_USE_CUDNN_SDPA=0 $P --name "shape_probe_$m" --label cudnn_off
    T=150 run env MLX_USE_CUDA_GRAPHS=0 $P --name "shape_probe_$m" --label graphs_off ;;
  decodes)
    # does a lone decode's cost depend on what ran before it (packed steps, big prefills, the profile)?
    export MLX_CUDA_USE_CUDNN_SDPA=0
    T=${T_DECODES:-240} run $PY -m probes.decode_probe $M ;;
  presize)
    export MLX_CUDA_USE_CUDNN_SDPA=0
    T=${T_PRESIZE:-200} run $PY -m probes.presize_probe $M --chunks 512,2048 --repeats ${REPEATS:-5} ;;
  align)
    export MLX_CUDA_USE_CUDNN_SDPA=0
    T=${T_ALIGN:-400} run $PY -m probes.align_ab $M --repeats ${REPEATS:-5} ;;
  singlereq)
    T=240 run $PY -m probes.h200_singlereq ;;
  limit)
    T=${T_LIMIT:-420} run $H bench engine --save --models ${LIMIT_MODELS:-qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b} --bits 4 \
      --prompt-tokens 4096 --decode-tokens 128 --repeats ${LIMIT_REPEATS:-5} ${LIMIT_ARGS:-} ;;
  exit)
    T=${T_EXIT:-150} run $PY -m probes.exit_probe --model qwen2.5-0.5b --bits 4 ;;
  contention)
    T=${T_CONT:-570} run $H bench contention --save --models ${CONT_MODELS:-qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b} \
      --bits 4 --doc-tokens 30000 --chat-context 1536 --repeats ${CONT_REPEATS:-5} --settings ${CONT_SETTINGS:-mlx_lm-2048 \
      interleave-2048 stall_free-1024 overlap-2048 overlap-2048-pipelined overlap-2048-pipelined-jobs16 slo} ${CONT_ARGS:-} ;;
  oprofile)
    T=${T_OPROF:-450} run $PY -m probes.overlap_profile --models ${OPROF_MODELS:-qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b} \
      --bits 4 --doc-tokens 30000 --chat-context 1536 --settings overlap-2048-pipelined overlap-2048-pipelined-jobs16 \
      --switch default --repeats ${REPEATS:-6} --platform h200 ;;
  determinism)
    T=${T_DET:-200} run $PY -m probes.determinism_probe --model ${DET_MODEL:-qwen2.5-0.5b} --bits 4 --platform h200 ;;
  serve)
    T=${T_SERVE:-400} run $H bench serve --save --models ${SERVE_MODELS:-qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b} \
      --bits 4 --streams 1 16 --prompt-tokens 1024 --max-tokens 128 --repeats ${SERVE_REPEATS:-5} ;;
  compiled)
    for m in ${COMPILED_MODELS:-qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b}; do
      T=${T_COMPILED:-180} run $PY -m probes.compiled_decode_probe --model "$m" --bits 4 --context 1024 --tokens 128 \
        --repeats ${REPEATS:-5} --platform h200 --name "compiled_decode_probe_$m"
    done ;;
  http)
    m=${HTTP_MODEL:-qwen2.5-coder-1.5b}
    dir=$(mktemp -d)/$m-4bit  # the results name the directory by its last part only
    T=120 run $H export-model "$m" --bits 4 --out "$dir"
    T=${T_HTTP:-540} run $H bench http --save --model-dir "$dir" --policies ${HTTP_POLICIES:-slo interleave} --workers 4 \
      --chat-chars 1500 --chat-tokens ${HTTP_CHAT_TOKENS:-100} --doc-chars 16000 --doc-tokens ${HTTP_DOC_TOKENS:-8} --repeats ${HTTP_REPEATS:-2} \
      --window-s ${HTTP_WINDOW_S:-30} --prefill-step 2048 --name "${HTTP_NAME:-serve_http_$m${HTTP_SUFFIX:-}}" ;;
  tune)
    m=${TUNE_MODEL:-qwen2.5-coder-1.5b}
    case ${TUNE_TRACE:-recorded} in
      recorded) tr=(--trace data/traces/samples/seed001_scene_tiny.jsonl --length-scale "${TUNE_LENGTH_SCALE:-4}")
                nm="tune_$m" ;;
      azure) tr=(--trace data/traces/samples/azure_llm_conv_2023_first64.csv --split-tokens 1000 --max-requests 40
                 --time-scale "${TUNE_TIME_SCALE:-1}")  # 0.5: arrivals twice as dense, each run ~half the trace's 24 s
             nm="tune_azure_$m" ;;
      *) echo "TUNE_TRACE is recorded or azure" >&2; exit 2 ;;
    esac
    if [ -n "${TUNE_CHAT_SCALE:-}" ]; then  # the chat asks N x its tokens: its ITL p99 rests on N x the gaps
      tr+=(--output-scale "chat=$TUNE_CHAT_SCALE"); nm="${nm}_chat_x$TUNE_CHAT_SCALE"
    fi
    if [ -n "${TUNE_STEADY:-}" ]; then  # every setting scored warm: simulated on its second run, each engine run after
      tr+=(--steady); nm="${nm}_steady"  # one of itself in that process (the sweep's resumes too: the file says so)
    fi
    if [ -n "${TUNE_GRID:-}" ]; then  # wide: each policy's own knob varied too (mlxlab.studies.tune.grid)
      tr+=(--grid "$TUNE_GRID"); [ "$TUNE_GRID" = standard ] || nm="${nm}_$TUNE_GRID"
    fi
    if [ -n "${TUNE_CACHED_PROFILE:-}" ]; then  # tune takes its profile from the cache: the committed one of this card
      # (data/profiles/tune/PLAT/, brought back by an earlier call), so its process runs no profile before it confirms:
      # whether tune's own process then measures the settings as a resumed one does (probes/sweep_processes.py)
      mkdir -p data/profiles/cache && cp data/profiles/tune/"$PLAT"/"$m"-*.json data/profiles/cache/ 2>/dev/null ||
        { echo "no committed profile of $m in data/profiles/tune/$PLAT/" >&2; exit 2; }
      nm="${nm}_cached_profile"
    fi
    tt=${T_TUNE:-570}
    more=()  # the platform's committed file, if any: go on with its sweep (same card kind: the file names its card);
    # TUNE_FRESH=1 runs tune again over it
    { [ -n "${TUNE_RESUME:-}" ] || { [ -z "${TUNE_FRESH:-}" ] && [ -f "data/results/$PLAT/$nm.json" ]; }; } &&
      more=(--resume "data/results/$PLAT/$nm.json")
    T=$tt run $H tune --save --model "$m" --bits 4 "${tr[@]}" --slo "${TUNE_SLO:-chat.itl_p99<=3x}" \
      --sweep --repeats ${TUNE_REPEATS:-3} --time-budget-s $((tt - 40)) "${more[@]}" --name "$nm"
    if [ -n "${TUNE_CACHED_PROFILE:-}" ] && [ -z "${more[*]}" ] && ! grep -q "profile from the cache" "$LOG"; then
      echo "WARNING: TUNE_CACHED_PROFILE: the committed profile's key did not match this machine; tune profiled" | tee -a "$LOG"
    fi
    # the measured profile (its records: which steps the cost model misses), where the call brings files back
    if [ -n "${OUT:-}" ] && ls data/profiles/cache/"$m"-*.json >/dev/null 2>&1; then
      mkdir -p "$OUT/profiles" && cp data/profiles/cache/"$m"-*.json "$OUT/profiles/"
    fi ;;
  tail)  # issue 37 item 1d: the chat's gaps split by the steps that ended inside them, engine against simulator, on
    # the platform's tune file of TAIL_MODEL: the trace as tuned, then with the chat asking TAIL_CHAT_SCALE x its tokens
    # TAIL_TUNE names another tune file of the platform (e.g. tune_qwen2.5-coder-1.5b_chat_x4_steady_cached_profile,
    # whose chat already asks 4x: TAIL_CHAT_SCALE=1 then skips the scaled run) and TAIL_LABEL the results' suffix
    m=${TAIL_MODEL:-llama-3.2-1b}
    P="$PY -m probes.tail_steps data/results/$PLAT/${TAIL_TUNE:-tune_$m}.json --settings ${TAIL_SETTINGS:-interleave-4096 admission_gate-4096} --repeats ${TAIL_REPEATS:-3}"
    T=${T_TAIL:-270} run $P ${TAIL_LABEL:+--label $TAIL_LABEL}
    [ "${TAIL_CHAT_SCALE:-4}" = 1 ] || T=${T_TAIL:-270} run $P --output-scale chat=${TAIL_CHAT_SCALE:-4} \
      --label "${TAIL_LABEL:+${TAIL_LABEL}_}chat_x${TAIL_CHAT_SCALE:-4}" ;;
  process)  # issue 37: what in tune's process slows the engine: two settings of PROC_TUNE measured between tune's
    # steps (a profile of its grid, the chat's solo runs, mlx-lm's BatchGenerator runs) in one process, with phases
    # of no step to show the drift (probes/process_state.py)
    f=${PROC_TUNE:-data/results/$PLAT/tune_qwen2.5-coder-1.5b_chat_x4_cached_profile.json}
    [ -f "$f" ] || f=data/results/$PLAT/tune_qwen2.5-coder-1.5b_chat_x4.json
    # PROC_SETTINGS: grid labels to measure (default: the tune's choice and the sweep's best); on the H100 coder chat
    # x4 file those are stall_free-256 (28 s a run) and -512: with stall_free-512 and -1024 (33 s a round) the six
    # phases fit one call. The file is written after each phase, so a call cut short keeps what finished
    T=${T_PROC:-560} run $PY -m probes.process_state "$f" --rounds ${PROC_ROUNDS:-2} ${PROC_SETTINGS:+--settings $PROC_SETTINGS} \
      ${PROC_PHASES:+--phases $PROC_PHASES} ${PROC_SUFFIX:+--suffix $PROC_SUFFIX} ${PROC_FOLLOWS:+--follows $PROC_FOLLOWS} ;;
  packed)  # issue 37 item 1b: a packed step against its two forwards back to back at one repeated shape (after the
    # first repeat every shape is warm), with mlx's default cuDNN attention and with it off: one process each
    P="$PY -m probes.fused_step_bench $M --repeats ${PACKED_REPEATS:-15}"
    T=150 run $P --name fused_step_bench_cudnn_on
    T=150 run env MLX_CUDA_USE_CUDNN_SDPA=0 $P --name fused_step_bench_cudnn_off ;;
  apart)  # issue 36 item 3 in one process: 8-token documents joining the chat's batch or decoding apart
    am=${APART_MODEL:-qwen2.5-0.5b}
    T=${T_APART:-400} run $PY -m probes.decode_apart_probe --model "$am" --bits 4 --doc-tokens 16000 \
      --chat-context 1500 --chat-tokens 256 --apart none,4096 --repeats ${APART_REPEATS:-5} \
      --name "decode_apart_probe_$am" ;;
  soak)
    m=${SOAK_MODEL:-qwen2.5-coder-1.5b}
    dir=$(mktemp -d)/$m-4bit
    T=120 run $H export-model "$m" --bits 4 --out "$dir"
    T=${T_SOAK:-580} run $H bench soak --save --model "$dir" --minutes ${SOAK_MINUTES:-8} --name "serve_soak_$m" ;;
  encode)  # the probe starts mlxlab serve: the server's wheels (.whl/, as serve), installed as scripts/h200.sh does
    if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d .whl/site ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl
    fi
    PY="env PYTHONPATH=.mlxcuda/site:.:$PWD/.whl/site MLXLAB_PLATFORM=$PLAT PYTHONUNBUFFERED=1 python3"
    T=${T_ENCODE:-300} run $PY -m probes.encode_gil_probe --model qwen2.5-coder-1.5b --bits 4 --repeats 5 --chat-tokens 300 ;;
  disagg2)
    m=${DISAGG_MODEL:-qwen2.5-coder-1.5b}
    n=${DISAGG_DOC_TOKENS:-8192}
    T=${T_DISAGG:-570} run $H bench disagg --save --platform h200x2 --gpus --model "$m" --bits 4 --dtype float16 \
      --doc-tokens "$n" --chat-context 1536 --doc-max-tokens 8 --chunk-size 2048 --repeats ${DISAGG_REPEATS:-5} \
      --rounds 2 --settings single disagg split --name "disagg_${m}_$n" ;;
  *) echo "unknown PART $part" >&2; exit 2 ;;
esac
if [ -n "${OUT:-}" ]; then
  # only what this call wrote: the device tool brings back a limited number of files
  # the committed files as $OUT/PLATFORM/NAME; run folders (runs/TIME/) stay behind: three folders down never comes back
  mkdir -p "$OUT/$PLAT"
  if [ -d "data/results/$PLAT" ]; then
    # not runs/TIME/ (server logs): three folders down does not come back, and only 8 files do
    (cd "data/results/$PLAT" && find . -path ./runs -prune -o -type f -newer "$MARK" -exec cp --parents {} "$OUT/$PLAT/" \;)
  fi
  # the server logs of an http or soak call (mlx_lm.server's own errors, e.g. the generation thread that died
  # on llama-3.2-1b), the first and the last 150 lines of each (the first error, then every request failing
  # after it: on 2026-12-05 the last 300 lines held only the later requests' "generation thread died")
  find "data/results/$PLAT/runs" -name 'server_*.log' -newer "$MARK" 2>/dev/null | head -4 | while read -r f; do
    { head -n 150 "$f"; echo "[... $(wc -l < "$f") lines in all ...]"; tail -n 150 "$f"; } > "$OUT/logs/$(basename "$f")"
  done
  if [ -d data/results/h200x2 ]; then
    mkdir -p "$OUT/h200x2" && (cd data/results/h200x2 && find . -type f -newer "$MARK" -exec cp --parents {} "$OUT/h200x2/" \;)
  fi
  if ls data/profiles/h200-*.json >/dev/null 2>&1; then mkdir -p "$OUT/profiles" && cp data/profiles/h200-*.json "$OUT/profiles/"; fi
fi
if [ -n "${OUT:-}" ] && [ -d "$TMPD/mlx" ]; then  # the kernel cache as it stands (not above 20 MB packed)
  tar cJf "$OUT/mlx-ptx.tar.xz.part" -C "$TMPD" mlx 2>/dev/null &&
    [ "$(stat -c %s "$OUT/mlx-ptx.tar.xz.part")" -lt 20000000 ] && mv "$OUT/mlx-ptx.tar.xz.part" "$OUT/mlx-ptx.tar.xz"
  rm -f "$OUT/mlx-ptx.tar.xz.part"
fi
