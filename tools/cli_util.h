// Small helpers shared by the subcommands: CLI11 parsing with the project's
// exit-status convention (help: 0; bad usage: one line on stderr, status 2).
#pragma once

#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>

#include <csignal>
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

// Servers (serve, gateway): SIGINT and SIGTERM blocked on this thread and on
// every thread started after it, so that only the thread that sigwait()s on
// the returned set sees them; SIGPIPE ignored (a client gone mid-write).
inline sigset_t block_stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return sigs;
}

// A server's last line and exit status: 0 when nothing was left unfinished.
inline int stopped_status(const std::string& cmd, size_t unfinished) {
  if (unfinished > 0) {
    std::fprintf(stderr, "%s: stopped with %zu requests unfinished\n", cmd.c_str(), unfinished);
    return 1;
  }
  std::fprintf(stderr, "%s: stopped\n", cmd.c_str());
  return 0;
}

}  // namespace serval::cli
