"""Metal-emulation harness: runs ``mx.fast.metal_kernel`` kernels on the CPU (see harness.py)."""
