// Runs scripts/render_chat_templates.py (Python's jinja2, configured like
// Hugging Face transformers) at test time, so our renderer is checked against
// an independent implementation rather than stored outputs of our own.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace serval::chat_template_test {

// (From the build, not __FILE__: a compiler cache may make __FILE__ relative.)
inline std::string project_root() { return SERVAL_SOURCE_DIR; }

inline std::string reference_script() { return project_root() + "/scripts/render_chat_templates.py"; }

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

struct ReferenceRun {
  bool available = false;  // python3 + jinja2 present
  std::string why;         // when not available, or when it failed
  nlohmann::ordered_json result;
};

// Runs the script with `args`; parses its JSON output.
inline ReferenceRun run_reference(const std::string& args) {
  ReferenceRun run;
  const char* python = "/usr/bin/python3";
  if (access(python, X_OK) != 0) {
    run.why = "/usr/bin/python3 is not installed";
    return run;
  }
  std::string cmd = std::string(python) + " " + shell_quote(reference_script()) + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    run.why = "popen failed";
    return run;
  }
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 3) {
    run.why = "python3-jinja2 is not installed";
    return run;
  }
  run.available = true;
  if (code != 0) {
    run.why = "reference script failed with exit code " + std::to_string(code);
    return run;
  }
  run.result = nlohmann::ordered_json::parse(out, nullptr, false);
  if (run.result.is_discarded()) run.why = "reference script printed invalid JSON";
  return run;
}

// Writes `cases` ([{template, context}]) to a temp file and renders them.
inline ReferenceRun run_reference_cases(const nlohmann::ordered_json& cases) {
  char path[] = "/tmp/serval_chat_template_cases_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    ReferenceRun r;
    r.why = "mkstemp failed";
    return r;
  }
  close(fd);
  {
    std::ofstream f(path, std::ios::binary);
    f << cases.dump();
  }
  ReferenceRun r = run_reference("--cases " + shell_quote(path));
  std::remove(path);
  return r;
}

// Shows where two strings first differ.
inline std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  auto window = [&](const std::string& s) {
    size_t b = i > 60 ? i - 60 : 0;
    return nlohmann::json(s.substr(b, 140)).dump();
  };
  return "first difference at byte " + std::to_string(i) + " (want " + std::to_string(want.size()) +
         " bytes, got " + std::to_string(got.size()) + ")\n  want: " + window(want) + "\n  got:  " + window(got);
}

}  // namespace serval::chat_template_test
