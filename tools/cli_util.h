// Small helpers shared by the subcommands: CLI11 parsing with the project's
// exit-status convention (help: 0; bad usage: one line on stderr, status 2).
#pragma once

#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
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

// What a server does when SIGINT or SIGTERM arrives (drain_on_signal).
struct DrainHooks {
  std::function<size_t()> in_flight;  // requests still running
  std::function<void()> begin;        // stop taking new work (answer 503, stop accepting)
  std::function<void()> cancel;       // abort what still runs (may be empty)
  std::function<void()> stop;         // stop the HTTP server: its run() returns
};

// What drain_on_signal() leaves running. finish() (or the destructor) waits
// for the drain to end, then disarms the hooks: a second signal that arrives
// while the server's objects are being destroyed must not call into them (it
// would, before: the harness's second SIGTERM after 3 s of a slow shutdown
// reached HttpServer::stop() on a freed server). After finish(), a second
// signal exits the process at once (status 1) without touching anything.
class SignalDrain {
 public:
  struct State {
    DrainHooks hooks;
    std::mutex mu;
    bool armed = true;
    std::atomic<bool> now{false};  // a second signal: stop waiting for the drain
  };
  SignalDrain(std::thread t, std::shared_ptr<State> s) : t_(std::move(t)), s_(std::move(s)) {}
  SignalDrain(SignalDrain&&) = default;
  SignalDrain& operator=(SignalDrain&&) = delete;
  ~SignalDrain() { finish(); }
  void finish() {
    if (t_.joinable()) t_.join();
    if (s_) {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->armed = false;
    }
  }

 private:
  std::thread t_;
  std::shared_ptr<State> s_;
};

// A thread that waits for the first stop signal in `sigs`, then begins the
// drain and lets the requests in flight finish for up to timeout_s before
// cancelling what is left and stopping. A second signal stops at once.
inline SignalDrain drain_on_signal(sigset_t sigs, std::string cmd, double timeout_s, DrainHooks hooks) {
  auto st = std::make_shared<SignalDrain::State>();
  st->hooks = std::move(hooks);
  std::thread t([sigs, cmd = std::move(cmd), timeout_s, st] {
    DrainHooks* h = &st->hooks;
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "%s: signal %d: draining (%zu requests in flight, up to %.0f s)\n", cmd.c_str(), sig, h->in_flight(),
                 timeout_s);
    h->begin();
    std::thread([sigs, st, cmd] {
      int s2 = 0;
      sigwait(&sigs, &s2);
      std::lock_guard<std::mutex> lk(st->mu);
      if (!st->armed) {
        std::fprintf(stderr, "%s: signal %d during shutdown: exiting at once\n", cmd.c_str(), s2);
        std::_Exit(1);
      }
      st->now = true;
      if (st->hooks.cancel) st->hooks.cancel();
      st->hooks.stop();
    }).detach();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds((int64_t)(timeout_s * 1000));
    while (h->in_flight() > 0 && !st->now && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (st->now) return;  // the second signal's thread cancelled and stopped
    {
      std::lock_guard<std::mutex> lk(st->mu);
      if (h->cancel) h->cancel();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the last responses flush
    std::lock_guard<std::mutex> lk(st->mu);
    h->stop();
  });
  return SignalDrain(std::move(t), std::move(st));
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
