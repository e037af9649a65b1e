// The roofline of this machine, for docs/PERFORMANCE.md: memory read
// bandwidth and the peak throughput of the instructions the kernels are made
// of (src/common/roofline.h measures them).
//
//   serval_roofline [--threads T] [--mb MiB] [--reps R]
// prints one line per measurement: the median and the best of R runs.
// Instructions the CPU lacks are reported as "n/a".
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/roofline.h"

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  size_t mb = 1024;
  const char* usage = "usage: serval_roofline [--threads 1..256] [--mb 64..] [--reps 1..100]\n";
  if (argc % 2 == 0) {
    std::fprintf(stderr, "%s", usage);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (a == "--threads" && v >= 1 && v <= 256) threads = (int)v;
    else if (a == "--mb" && v >= 64 && v <= (1 << 20)) mb = (size_t)v;
    else if (a == "--reps" && v >= 1 && v <= 100) reps = (int)v;
    else {
      std::fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  auto bw = serval::measure_read_bandwidth(threads, mb, reps);
  if (!bw.ok()) {
    std::fprintf(stderr, "serval_roofline: %s\n", bw.status().message().c_str());
    return 1;
  }
  std::printf("threads %d, reps %d (median / best)\n", threads, reps);
  std::printf("memory read bandwidth      %8.1f / %8.1f GB/s   (%zu MiB buffer)\n", bw->median, bw->best, mb);
  for (const serval::RooflinePeak& p : serval::measure_peaks(threads, reps)) {
    if (!p.available) {
      std::printf("%-30s      n/a\n", p.name.c_str());
      continue;
    }
    std::printf("%-30s %8.1f / %8.1f %s\n", p.name.c_str(), p.figure.median, p.figure.best, p.unit.c_str());
  }
  return 0;
}
