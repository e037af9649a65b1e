// Every template of ../shared/chat-templates x every conversation of
// scripts/render_chat_templates.py must render byte-identically to Python's
// jinja2 (as Hugging Face transformers configures it), or fail in both.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "reference.h"
#include "tokenizer/chat_template/chat_template.h"

namespace serval {
namespace {

using chat_template_test::first_difference;
using chat_template_test::run_reference;
using chat_template_test::shell_quote;

size_t count_jinja_files(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 6 && name.compare(name.size() - 6, 6, ".jinja") == 0) ++n;
    }
    closedir(d);
  }
  return n;
}

TEST(ChatTemplateConformance, AllSharedTemplatesMatchJinja2) {
  // SERVAL_CHAT_TEMPLATES_DIR checks another folder of templates (a user's, or
  // new families' before they join the shared set).
  const char* other = std::getenv("SERVAL_CHAT_TEMPLATES_DIR");
  const std::string dir = other && *other ? std::string(other) : std::string(SERVAL_SHARED_DIR) + "/chat-templates";
  size_t n_files = count_jinja_files(dir);
  ASSERT_GT(n_files, 0u) << "no templates in " << dir;

  auto ref = run_reference("--templates " + shell_quote(dir));
  if (!ref.available) GTEST_SKIP() << "reference renderer unavailable: " << ref.why;
  ASSERT_TRUE(ref.why.empty()) << ref.why;
  const auto& out = ref.result;
  ASSERT_EQ(out["templates"].size(), n_files);
  const int64_t now = out["now_unix_seconds"].get<int64_t>();

  std::vector<std::optional<ChatTemplate>> compiled;
  std::vector<std::string> compile_errors;
  for (const auto& t : out["templates"]) {
    auto c = ChatTemplate::compile(t["source"].get<std::string>());
    if (c.ok()) {
      compiled.emplace_back(std::move(*c));
      compile_errors.emplace_back();
    } else {
      compiled.emplace_back(std::nullopt);
      compile_errors.push_back(c.status().message());
    }
  }

  ChatTemplateRenderOptions opts;
  opts.now_unix_seconds = now;
  size_t identical = 0, both_raise = 0, mismatches = 0;
  for (const auto& r : out["results"]) {
    size_t ti = r["template"].get<size_t>();
    size_t ci = r["conversation"].get<size_t>();
    const std::string tname = out["templates"][ti]["name"].get<std::string>();
    const std::string cname = out["conversations"][ci]["name"].get<std::string>();
    const auto& ctx = out["conversations"][ci]["context"];
    bool ref_ok = r.contains("output");
    std::optional<std::string> got;
    std::string err;
    if (!compiled[ti]) {
      err = compile_errors[ti];
    } else {
      auto g = compiled[ti]->render(ctx, opts);
      if (g.ok()) {
        got = *g;
      } else {
        err = g.status().message();
      }
    }
    if (ref_ok && got && *got == r["output"].get<std::string>()) {
      ++identical;
    } else if (!ref_ok && !got) {
      ++both_raise;
    } else {
      ++mismatches;
      std::string detail;
      if (ref_ok && got) {
        detail = first_difference(r["output"].get<std::string>(), *got);
      } else if (ref_ok) {
        detail = "jinja2 rendered it, we failed: " + err;
      } else {
        detail = "jinja2 raised (" + r["error"].get<std::string>() + "), we rendered " +
                 nlohmann::json(got->substr(0, 200)).dump();
      }
      ADD_FAILURE() << tname << " x " << cname << ": " << detail;
    }
  }
  std::cout << "[ chat templates ] " << out["results"].size() << " (template x conversation) pairs: " << identical
            << " byte-identical, " << both_raise << " raise in both, " << mismatches << " mismatches (jinja2 "
            << out["jinja2_version"].get<std::string>() << ")\n";
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(identical, out["results"].size() / 2);
}

}  // namespace
}  // namespace serval
