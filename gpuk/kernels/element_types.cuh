// element_types.cuh: elem_t, the element type a kernel module is built for, and acc_t, the
// type it accumulates in. The launcher #defines ELEMENT_T and ACC_T (float for __half,
// __nv_bfloat16 and float, double for double); the float defaults let a .cu compile alone.
// Plain typedefs of #defines, not ElementTraits<elem_t>::acc, so kernel parameters may name
// them (kernel_source.py resolves them to the C types it casts scalars to).
#pragma once

#ifndef ELEMENT_T
#define ELEMENT_T float
#endif
#ifndef ACC_T
#define ACC_T float
#endif

typedef ELEMENT_T elem_t;
typedef ACC_T acc_t;
