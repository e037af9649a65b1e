// Loading a GGUF model and its tokenizer for a subcommand, with the CLI's
// error convention (one line on stderr; the caller returns status 2).
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

struct LoadedModel {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
};

inline std::optional<LoadedModel> load_model(const std::string& cmd, const std::string& path) {
  auto model = Model::load(path);
  if (!model.ok()) {
    std::fprintf(stderr, "%s: %s\n", cmd.c_str(), model.status().message().c_str());
    return std::nullopt;
  }
  LoadedModel l;
  l.model = std::shared_ptr<const Model>(std::move(model.value()));
  for (const std::string& w : l.model->warnings()) std::fprintf(stderr, "%s: warning: %s\n", cmd.c_str(), w.c_str());
  auto tok = Tokenizer::from_gguf(l.model->file());
  if (!tok.ok()) {
    std::fprintf(stderr, "%s: %s\n", cmd.c_str(), tok.status().message().c_str());
    return std::nullopt;
  }
  l.tok = std::make_shared<const Tokenizer>(std::move(tok.value()));
  return l;
}

}  // namespace serval::cli
