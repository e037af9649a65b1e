// The ChatTemplate API: compile/render, the standard chat context, template
// selection for a model, thread safety, and goldens for well-known templates
// that do not depend on the Python reference.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/chat_template/chat_template.h"

namespace serval {
namespace {

using nlohmann::ordered_json;

std::string read_shared_template(const std::string& name) {
  std::ifstream f(std::string(SERVAL_SHARED_DIR) + "/chat-templates/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string render(std::string_view src, const ordered_json& ctx = ordered_json::object()) {
  auto t = ChatTemplate::compile(src);
  if (!t.ok()) return "COMPILE ERROR: " + t.status().message();
  ChatTemplateRenderOptions opts;
  opts.now_unix_seconds = 1721997296;  // 2024-07-26 12:34:56 UTC
  auto r = t->render(ctx, opts);
  if (!r.ok()) return "RENDER ERROR: " + r.status().message();
  return *r;
}

TEST(ChatTemplateApi, RendersVariables) {
  EXPECT_EQ(render("Hello {{ name }}!", {{"name", "World"}}), "Hello World!");
  EXPECT_EQ(render("{{ n + 1 }} {{ f }} {{ b }} {{ z }}", {{"n", 41}, {"f", 2.0}, {"b", true}, {"z", nullptr}}),
            "42 2.0 True None");
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2024");
  // Keys keep their request order (ordered_json), as Python dicts do.
  EXPECT_EQ(render("{{ d|tojson }} {% for k in d %}{{ k }}{% endfor %}", ordered_json::parse(R"({"d": {"z": 1, "a": 2}})")),
            R"({"z": 1, "a": 2} za)");
  // A std::map-backed json works too (keys then iterate sorted).
  auto t = ChatTemplate::compile("{% for k in d %}{{ k }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  auto r = t->render(nlohmann::json::parse(R"({"d": {"z": 1, "a": 2}})"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "az");
}

TEST(ChatTemplateApi, RejectsNonObjectContext) {
  auto t = ChatTemplate::compile("x");
  ASSERT_TRUE(t.ok());
  auto r = t->render(ordered_json::array());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("JSON object"), std::string::npos);
  ChatTemplate empty;
  EXPECT_FALSE(empty.render(ordered_json::object()).ok());
}

TEST(ChatTemplateApi, BuildsTheStandardContext) {
  ordered_json messages = ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
      {"id": "call2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}
  ])");
  ChatContextOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.add_generation_prompt = false;
  o.extra = {{"date_string", "01 Jan 2025"}};
  auto ctx = build_chat_context(messages, o);
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  EXPECT_EQ((*ctx)["messages"][1]["content"], "Hello\nthere");
  EXPECT_EQ((*ctx)["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  EXPECT_TRUE((*ctx)["tools"].is_null());
  EXPECT_TRUE((*ctx)["documents"].is_null());
  EXPECT_EQ((*ctx)["add_generation_prompt"], false);
  EXPECT_EQ((*ctx)["bos_token"], "<s>");
  EXPECT_EQ((*ctx)["date_string"], "01 Jan 2025");

  o.parse_tool_call_arguments = true;
  o.tools = ordered_json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  auto ctx2 = build_chat_context(messages, o);
  ASSERT_TRUE(ctx2.ok());
  EXPECT_EQ((*ctx2)["messages"][2]["tool_calls"][0]["function"]["arguments"], ordered_json({{"x", 1}}));
  EXPECT_EQ((*ctx2)["messages"][2]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ((*ctx2)["tools"].size(), 1u);
}

TEST(ChatTemplateApi, ContextValidationNamesTheField) {
  ChatContextOptions o;
  struct Case {
    const char* messages;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"role": "user"})", "messages: expected an array"},
      {R"([1])", "messages[0]: expected an object"},
      {R"([{"content": "x"}])", "messages[0].role"},
      {R"([{"role": "user", "content": 5}])", "messages[0].content"},
      {R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])", "image_url"},
      {R"([{"role": "user", "content": [{"type": "text"}]}])", "messages[0].content[0].text"},
  };
  for (const auto& c : cases) {
    auto ctx = build_chat_context(ordered_json::parse(c.messages), o);
    ASSERT_FALSE(ctx.ok()) << c.messages;
    EXPECT_NE(ctx.status().message().find(c.needle), std::string::npos) << ctx.status().message();
  }
  o.extra = {{"messages", 1}};
  EXPECT_FALSE(build_chat_context(ordered_json::array(), o).ok());
  o.extra = nullptr;
  o.tools = "not an array";
  EXPECT_FALSE(build_chat_context(ordered_json::array(), o).ok());
}

TEST(ChatTemplateApi, SelectsTheModelTemplate) {
  auto none = select_chat_template(std::nullopt, std::nullopt);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::not_found);
  EXPECT_NE(none.status().message().find("no chat template"), std::string::npos);

  auto from_model = select_chat_template(std::nullopt, std::string("model"));
  ASSERT_TRUE(from_model.ok());
  EXPECT_EQ(from_model->source(), "model");
  auto from_flag = select_chat_template(std::string("flag"), std::string("model"));
  ASSERT_TRUE(from_flag.ok());
  EXPECT_EQ(from_flag->source(), "flag");

  auto bad = select_chat_template(std::string("{% if %}"), std::nullopt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--chat-template"), std::string::npos);
  auto bad_model = select_chat_template(std::nullopt, std::string("{{ x|nope }}"));
  ASSERT_FALSE(bad_model.ok());
  EXPECT_NE(bad_model.status().message().find("tokenizer.chat_template"), std::string::npos);
}

ordered_json chat(bool add_generation_prompt) {
  ChatContextOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.bos_token = "<|begin_of_text|>";
  o.eos_token = "<|eot_id|>";
  auto ctx = build_chat_context(ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"}
  ])"),
                                o);
  return *ctx;
}

TEST(ChatTemplateApi, GoldenQwen25) {
  auto t = ChatTemplate::compile(read_shared_template("Qwen-Qwen2.5-7B-Instruct.jinja"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto r = t->render(chat(true));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nHow are you?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateApi, GoldenLlama32) {
  auto t = ChatTemplate::compile(read_shared_template("meta-llama-Llama-3.2-3B-Instruct.jinja"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  ChatTemplateRenderOptions opts;
  opts.now_unix_seconds = 1721997296;
  auto r = t->render(chat(true), opts);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are helpful.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateApi, GoldenGemmaRejectsSystemRole) {
  auto t = ChatTemplate::compile(read_shared_template("google-gemma-2-2b-it.jinja"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto r = t->render(chat(true));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("System role not supported"), std::string::npos) << r.status().message();
}

TEST(ChatTemplateApi, ConcurrentRendersAreIndependent) {
  auto t = ChatTemplate::compile(read_shared_template("meetkai-functionary-medium-v3.2.jinja"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  ChatContextOptions o;
  o.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "description": "City"}, "days": {"type": "integer", "default": 1}},
      "required": ["city"]}}}])");
  std::vector<ordered_json> contexts;
  std::vector<std::string> expected;
  for (int i = 0; i < 4; ++i) {
    auto ctx = build_chat_context(ordered_json::array({{{"role", "user"}, {"content", "question " + std::to_string(i)}}}),
                                  o);
    contexts.push_back(*ctx);
    expected.push_back(*t->render(contexts.back()));
  }
  const ChatTemplate& shared = *t;
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      for (int k = 0; k < 50; ++k) {
        int i = (th + k) % 4;
        auto r = shared.render(contexts[i]);
        if (!r.ok() || *r != expected[i]) ++failures[th];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

}  // namespace
}  // namespace serval
