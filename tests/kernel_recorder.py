"""A stand-in for ``mx.fast.cuda_kernel`` that records what the launchers hand to MLX,
and fake tensor maps, for tests that check launch plans without a GPU
(tests/test_cuda_compile.py, tests/test_tile_gpu_time.py, tests/test_chain_timeline.py)."""

import re


def record_launches(monkeypatch) -> "Recorder":
    """A :class:`Recorder` standing in for ``mx.fast.cuda_kernel``, with ``mx.compile``
    an identity: a bound launcher (``LaunchSpec.bound``) replays its traced launch
    without calling the kernel object again and hands it tracers, not the caller's
    arrays, so the recorder would see one launch of placeholders. The replay has its
    own test (tests/test_cuda_compile.py)."""
    import mlx.core as mx

    rec = Recorder()
    monkeypatch.setattr(mx.fast, "cuda_kernel", rec)
    monkeypatch.setattr(mx, "compile", lambda fun, *a, **kw: fun)
    return rec


class Recorder:
    """Stands in for mx.fast.cuda_kernel: records each build and launch, returns zeros."""

    def __init__(self):
        self.launches = []
        self.builds = []

    def __call__(self, *, name, input_names, output_names, source, header,
                 ensure_row_contiguous, shared_memory):
        import mlx.core as mx

        # name: the kernel as this file knows it; mlx_name: what MLX is given (with the
        # digest of its text, see mlx_w8a8.kernels.cuda.launch._kernel)
        mlx_name, name = name, re.sub(r"_[0-9a-f]{12}$", "", name)
        assert mlx_name != name, f"{mlx_name}: no digest of the kernel text in its name"
        self.builds.append(dict(name=name, mlx_name=mlx_name, source=source, header=header))

        def launch(*, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                   init_value=None, **_):
            self.launches.append(dict(
                name=name, mlx_name=mlx_name, inputs=list(input_names), outputs=list(output_names),
                source=source, header=header, shared_memory=shared_memory, grid=grid,
                threadgroup=threadgroup, template=list(template or []), arrays=inputs,
                output_shapes=[tuple(s) for s in output_shapes],
                output_dtypes=list(output_dtypes)))
            return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]

        launch.name = mlx_name  # what MLX would be given, to tell kernel objects apart
        return launch


def fake_prototype(rows: int, k: int, box_rows: int, box_k: int = 128, swizzle: bool = True) -> bytes:
    """Stands in for the driver's tensor-map encoding (none here): the sizes, readable
    back (``box_k`` and ``swizzle`` only where they are not the defaults)."""
    import numpy as np

    from mlx_w8a8.kernels import tensormap

    sizes = [rows, k, box_rows] + ([] if (box_k, swizzle) == (128, True) else [box_k, int(swizzle)])
    return np.array(sizes, dtype=np.uint64).tobytes().ljust(tensormap.MAP_BYTES, b"\0")


def fake_tensor_maps(monkeypatch) -> None:
    """Tensor maps encodable as on a machine with the CUDA driver (:func:`fake_prototype`),
    the launchers' cache of prototypes emptied; the caller empties it again after use."""
    from mlx_w8a8.kernels import tensormap
    from mlx_w8a8.kernels.cuda import gemm_dequant
    from mlx_w8a8.kernels.cuda import tma as cuda_tma

    monkeypatch.setattr(tensormap, "prototype", fake_prototype)
    monkeypatch.setattr(tensormap, "available", lambda: True)
    cuda_tma._tma_prototypes.cache_clear()
    gemm_dequant.dequant_prototypes.cache_clear()
