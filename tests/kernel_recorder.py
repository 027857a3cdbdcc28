"""A stand-in for ``mx.fast.cuda_kernel`` that records what the launchers hand to MLX,
for tests that check launch plans without a GPU (tests/test_cuda_compile.py,
tests/test_tile_gpu_time.py)."""

import re


class Recorder:
    """Stands in for mx.fast.cuda_kernel: records each build and launch, returns zeros."""

    def __init__(self):
        self.launches = []
        self.builds = []

    def __call__(self, *, name, input_names, output_names, source, header,
                 ensure_row_contiguous, shared_memory):
        import mlx.core as mx

        # name: the kernel as this file knows it; mlx_name: what MLX is given (with the
        # digest of its text, see cuda_launch._kernel)
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

        return launch
