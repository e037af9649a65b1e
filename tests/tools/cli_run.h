// Running the `serval` binary from the CLI tests: both streams captured, the
// exit status, and the one-line usage-error check.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace serval_cli_test {

inline const std::string kShared = SERVAL_SHARED_DIR;
inline const std::string kBin = SERVAL_BINARY;
inline const std::string kStories = kShared + "/models/stories260K.gguf";

struct Result {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs `serval ARGS` (args are shell-quoted by the caller) capturing both streams.
inline Result run(const std::string& args) {
  static std::atomic<int> counter{0};
  const std::string base = ::testing::TempDir() + "/serval_cli_" + std::to_string(getpid()) + "_" +
                           std::to_string(counter++);
  const std::string cmd = kBin + " " + args + " >" + base + ".out 2>" + base + ".err </dev/null";
  Result r;
  const int rc = std::system(cmd.c_str());
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

inline size_t count_lines(const std::string& s) { return (size_t)std::count(s.begin(), s.end(), '\n'); }

inline void expect_usage_error(const std::string& args, const std::string& needle) {
  Result r = run(args);
  EXPECT_EQ(r.status, 2) << args << "\nstderr: " << r.err;
  EXPECT_EQ(count_lines(r.err), 1u) << args << ": expected a one-line error, got:\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
}

}  // namespace serval_cli_test
