"""``python -m gpuk.kernels.build``: the ahead-of-time NVRTC build of every kernel variant.

The command's short name; the build itself is ``gpuk.kernels.runtime.build``.
"""
import sys

from gpuk.kernels.runtime.build import main

if __name__ == '__main__':
    sys.exit(main())
