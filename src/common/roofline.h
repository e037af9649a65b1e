// The roofline of this machine: memory read bandwidth (a streaming read of a
// buffer far larger than the caches, split over T threads) and the peak
// throughput of the instructions the kernels are made of: fp32 FMA
// (vfmadd231ps zmm / ymm) and int8 dot products (vpdpbusd zmm, AVX-VNNI
// vpdpbusd ymm, and the AVX2 vpmaddubsw + vpmaddwd + vpaddd triple), each on
// T threads with enough independent accumulators to cover latency.
// bench/roofline.cpp prints them (docs/PERFORMANCE.md); `serval plan profile`
// records them in a capacity profile.
//
// Each call starts its own T threads and blocks until they finish; calls must
// not overlap (they would measure each other). Instructions the CPU lacks are
// reported as not available.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"

namespace serval {

struct RooflineFigure {
  double median = 0, best = 0;  // over the repetitions
};

// GB/s reading a buffer of `mib` MiB (each thread its own slice) on `threads`
// threads, `reps` times. Needs AVX2 (unsupported otherwise); io_error when the
// buffer cannot be allocated.
Expected<RooflineFigure> measure_read_bandwidth(int threads, size_t mib, int reps);

struct RooflinePeak {
  std::string name;  // e.g. "int8 vpdpbusd zmm (AVX-512)"
  std::string unit;  // "GFLOP/s" or "GOP/s"
  bool fp32 = false;  // fp32 FMA (else int8 dot products, or bf16 below)
  bool bf16 = false;  // BF16 pair dot products into F32 (no kernel uses them)
  bool available = false;
  RooflineFigure figure;
};

// Every peak the file knows, in a fixed order (fp32 zmm, fp32 ymm, int8 zmm
// VNNI, int8 ymm VNNI, int8 ymm AVX2, bf16 zmm); unavailable ones are listed with
// available = false. `scale` (0, 1] shortens each loop (1 = the full 5 M steps).
std::vector<RooflinePeak> measure_peaks(int threads, int reps, double scale = 1.0);

}  // namespace serval
