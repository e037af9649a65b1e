// Loading a GGUF model and its tokenizer for a subcommand, with the CLI's
// error convention (one line on stderr; the caller returns status 2).
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

struct LoadedModel {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
};

// The ids the API accepts for a model file besides its served name: the
// file's base name, with and without ".gguf".
inline std::vector<std::string> model_file_ids(const std::string& path) {
  const std::string base = std::filesystem::path(path).filename().string();
  std::vector<std::string> ids = {base};
  if (base.size() > 5 && base.ends_with(".gguf")) ids.push_back(base.substr(0, base.size() - 5));
  return ids;
}

// generation: the subcommand generates (or scores) text, so an encoder
// (bert, nomic-bert: embeddings only) is refused with a line saying so.
// tp: this rank's shard of a tensor-parallel split (tp_flag.h); the whole model by default.
inline std::optional<LoadedModel> load_model(const std::string& cmd, const std::string& path, bool generation = true,
                                             TensorParallel tp = {}) {
  auto model = Model::load(path, tp);
  if (!model.ok()) {
    std::fprintf(stderr, "%s: %s\n", cmd.c_str(), model.status().message().c_str());
    return std::nullopt;
  }
  if (generation && (*model)->config().encoder) {
    std::fprintf(stderr, "%s: '%s' is an embedding model (%s): it does not generate text (serval serve answers "
                 "/v1/embeddings with it)\n", cmd.c_str(), path.c_str(), (*model)->config().arch.c_str());
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
