// serval tokenize -m MODEL [--bos] [--ids] [--no-parse-special] (TEXT | -f FILE)
//
// Prints the tokens of TEXT, one per line as `id 'piece'` (special tokens
// rendered as their text), or with --ids only the ids as one JSON array, the
// way `llama-tokenize --ids` does. BOS (and whatever else the model's metadata
// adds) only with --bos.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

int cmd_tokenize(int argc, char** argv) {
  const std::string cmd = "serval tokenize";
  CLI::App app("Print the tokens of a text", cmd);
  std::string model_path;
  std::string text;
  std::string file;
  bool add_bos = false;
  bool ids_only = false;
  bool no_parse_special = false;
  app.add_option("-m,--model", model_path, "GGUF model (or vocab-only) file")->required();
  auto* text_opt = app.add_option("text", text, "text to tokenize");
  auto* file_opt = app.add_option("-f,--file", file, "read the text from FILE");
  text_opt->excludes(file_opt);
  file_opt->excludes(text_opt);
  app.add_flag("--bos", add_bos, "add BOS (and EOS/SEP where the model's metadata asks for them)");
  app.add_flag("--ids", ids_only, "print only the ids, as one JSON array");
  app.add_flag("--no-parse-special", no_parse_special,
               "treat special-token texts such as <s> as plain text");
  if (auto status = parse(app, argc, argv)) return *status;

  if (file_opt->count() > 0) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return fail(cmd, "cannot read '" + file + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  } else if (text_opt->count() == 0) {
    return fail(cmd, "no text given (pass TEXT or -f FILE; see '" + cmd + " --help')");
  }

  auto f = gguf::GgufFile::open(model_path);
  if (!f.ok()) return fail(cmd, f.status().message());
  auto tok = Tokenizer::from_gguf(f.value());
  if (!tok.ok()) return fail(cmd, tok.status().message());

  const std::vector<TokenId> ids = tok->encode(text, add_bos, !no_parse_special);
  if (ids_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) line += ", ";
      line += std::to_string(ids[i]);
    }
    line += "]\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    return 0;
  }
  for (const TokenId id : ids) {
    const std::string piece = tok->token_to_piece(id, /*render_special=*/true);
    std::printf("%d '", id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::printf("'\n");
  }
  return 0;
}

}  // namespace serval::cli
