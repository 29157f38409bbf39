// Launch programs: one persistent, cooperative launch that runs a sequence of this folder's
// kernels (the program's instructions) where there were as many launches. Each kernel is
// compiled here unchanged as a device function (program_head.cuh), its blocks run by the
// persistent blocks in turn, and its lk_grid_wait is the grid-wide barrier between one
// instruction and the next (program_tail.cuh): every kernel waits there before it touches
// what the kernel before it wrote (suites/test_dependent_launch.py holds that), so a
// program computes what the launches compute, bit for bit.
#include "program_head.cuh"
#include "prologue_gemv.cu"
#include "gemv.cu"
#include "attention.cu"
#include "program_tail.cuh"
