// Template objects with attributes: namespace() (the only mutable value),
// the `loop` variable of for-loops, cycler() and joiner(). Used by one
// render call on one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template/value.h"

namespace serval::chat_template {

namespace ast {
struct Stmt;
}

struct NamespaceObj final : ObjectData {
  DictData attrs;  // insertion-ordered, string keys

  const char* type_name() const override { return "Namespace"; }
  std::optional<Value> get_attr(std::string_view name) const override;
  std::string repr() const override;
};

struct LoopObj final : ObjectData, std::enable_shared_from_this<LoopObj> {
  std::shared_ptr<const std::vector<Value>> items;
  int64_t index0 = 0;
  int depth0 = 0;
  const ast::Stmt* stmt = nullptr;  // the for statement (for recursive loop())
  Scope* outer = nullptr;           // the scope the loop runs in
  mutable std::optional<Value> last_changed;

  uint32_t items_depth = 0;

  const char* type_name() const override { return "LoopContext"; }
  uint32_t depth() const override { return items_depth + 2; }
  std::optional<Value> get_attr(std::string_view name) const override;
  std::string repr() const override;
  bool callable() const override { return true; }
  Value call(Evaluator& ev, const Value& self, CallArgs& args) override;
};

struct CyclerObj final : ObjectData, std::enable_shared_from_this<CyclerObj> {
  std::vector<Value> items;
  size_t pos = 0;
  uint32_t items_depth = 0;

  const char* type_name() const override { return "Cycler"; }
  uint32_t depth() const override { return items_depth + 2; }
  std::optional<Value> get_attr(std::string_view name) const override;
  std::string repr() const override { return "<Cycler>"; }
};

struct JoinerObj final : ObjectData {
  std::string sep;
  bool used = false;

  const char* type_name() const override { return "Joiner"; }
  std::optional<Value> get_attr(std::string_view) const override { return std::nullopt; }
  std::string repr() const override { return "<Joiner>"; }
  bool callable() const override { return true; }
  Value call(Evaluator& ev, const Value& self, CallArgs& args) override;
};

}  // namespace serval::chat_template
