// Small helpers shared by the subcommands: CLI11 parsing with the project's
// exit-status convention (help: 0; bad usage: one line on stderr, status 2).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <optional>
#include <string>

namespace serval::cli {

// Parses; returns an exit status when the command should stop now (help or error).
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see '%s --help')\n", app.get_name().c_str(), e.what(), app.get_name().c_str());
    return 2;
  }
  return std::nullopt;
}

// One-line error and the status for bad input.
inline int fail(const std::string& cmd, const std::string& msg, int status = 2) {
  std::fprintf(stderr, "%s: %s\n", cmd.c_str(), msg.c_str());
  return status;
}

// The whole file at `path` into `out`; false if it cannot be opened.
inline bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

}  // namespace serval::cli
