// Force-included (g++ -include) before a .cu file compiled by the emulated runtime:
// makes CUDA C++ device code compile as host C++17. See docs/kernels.md.
#pragma once
#include "emu_device.h"
