// The models of router mode (docs/ROUTER.md): from repeated -m NAME=FILE,
// every *.gguf in --models-dir, and a TOML preset file giving per-model
// settings (and models of its own by path).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "server/model_router.h"

namespace serval::cli {

// Whether a -m argument is NAME=FILE (router mode) rather than a file path:
// it has '=' after a non-empty name and is not itself an existing file.
bool is_named_model_arg(const std::string& arg);

// A LoRA argument NAME=FILE[:SCALE] (serve's --lora, the preset's `lora`
// entries): SCALE in [-100, 100], 1 when absent. The error says what is wrong
// (the caller prefixes where it came from).
Expected<server::RouterModelSpec::Adapter> parse_lora_arg(const std::string& text);

// named: NAME=FILE arguments; dir: a folder of *.gguf (empty: none);
// preset: a TOML file (empty: none). Errors name the argument, file or key.
Expected<std::vector<server::RouterModelSpec>> build_model_catalog(const std::vector<std::string>& named,
                                                                   const std::string& dir,
                                                                   const std::string& preset);

}  // namespace serval::cli
