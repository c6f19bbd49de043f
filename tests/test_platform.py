"""Where a result ran and with which backend switches: what gets stored beside each result."""

from mlxlab.core.environment import MLX_ENV_KNOWN, mlx_env


def test_a_misspelt_mlx_switch_is_flagged_with_the_name_mlx_reads():
    # the H200 study set MLX_CUDA_USE_CUDNN_SPDA=0 for a whole session; mlx ignored it
    settings, warnings = mlx_env({"MLX_CUDA_USE_CUDNN_SPDA": "0", "PATH": "/bin"})
    assert settings == {"MLX_CUDA_USE_CUDNN_SPDA": "0"}
    assert len(warnings) == 1 and "MLX_CUDA_USE_CUDNN_SDPA" in warnings[0]


def test_known_and_unrelated_mlx_names_are_kept_without_warnings():
    env = {"MLX_CUDA_USE_CUDNN_SDPA": "0", "MLX_USE_CUDA_GRAPHS": "1", "MLXLAB_PLATFORM": "h200",
           "MLX_SOMETHING_ELSE_ENTIRELY": "1"}
    settings, warnings = mlx_env(env)
    assert set(settings) == {"MLX_CUDA_USE_CUDNN_SDPA", "MLX_USE_CUDA_GRAPHS", "MLX_SOMETHING_ELSE_ENTIRELY"}
    assert warnings == []
    assert "MLX_CUDA_USE_CUDNN_SDPA" in MLX_ENV_KNOWN
