#include "model_catalog.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "serval/engine.h"

namespace serval::cli {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxModels = 1024;
constexpr size_t kMaxPresetBytes = 1 << 20;

bool valid_id(const std::string& s) {
  return !s.empty() && s.size() <= 256 &&
         std::none_of(s.begin(), s.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; });
}

std::string stem_of(const std::string& path) {
  std::string base = fs::path(path).filename().string();
  if (base.size() > 5 && base.ends_with(".gguf")) base.resize(base.size() - 5);
  return base;
}

// A path in the preset is relative to the preset file's folder.
std::string resolve(const std::string& preset, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(preset).parent_path() / p).lexically_normal().string();
}

Status apply_preset(const std::string& file, std::vector<server::RouterModelSpec>* specs) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return io_error("--models-preset: cannot read '" + file + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.size() > kMaxPresetBytes) return invalid_argument("--models-preset '" + file + "': larger than 1 MiB");
  toml::table tbl;
  try {
    tbl = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    std::ostringstream m;
    m << "--models-preset " << file << ":" << e.source().begin.line << ": " << e.description();
    return invalid_argument(m.str());
  }
  for (auto& [key, node] : tbl) {
    const std::string name(key.str());
    const std::string where = "--models-preset " + file + ": [" + name + "]";
    const toml::table* t = node.as_table();
    if (!t) return invalid_argument(where + ": expected a table of settings ([name] then key = value lines)");
    if (!valid_id(name)) return invalid_argument(where + ": a model name is 1 to 256 characters without control characters");
    auto it = std::find_if(specs->begin(), specs->end(), [&](const auto& s) { return s.name == name; });
    server::RouterModelSpec* s = it == specs->end() ? nullptr : &*it;
    server::RouterModelSpec fresh;
    fresh.name = name;
    if (!s) s = &fresh;
    for (auto& [k, v] : *t) {
      const std::string kk(k.str());
      const std::string at = where + "." + kk;
      if (kk == "path" || kk == "chat_template" || kk == "draft" || kk == "kv_memory") {
        auto str = v.value<std::string>();
        if (!str || str->empty()) return invalid_argument(at + ": expected a non-empty string");
        if (kk == "path") s->path = resolve(file, *str);
        if (kk == "chat_template") s->chat_template_file = resolve(file, *str);
        if (kk == "draft") s->draft_model = resolve(file, *str);
        if (kk == "kv_memory") {
          auto b = parse_kv_memory(*str);
          if (!b.ok()) return invalid_argument(at + ": " + b.status().message());
          s->kv_memory = *b;
        }
      } else if (kk == "ctx") {
        auto n = v.value<int64_t>();
        if (!n || *n < 0 || *n > (int64_t(1) << 20)) return invalid_argument(at + ": expected an integer in [0, 1048576]");
        s->ctx = *n;
      } else if (kk == "pinned") {
        auto b = v.value<bool>();
        if (!b) return invalid_argument(at + ": expected true or false");
        s->pinned = *b;
      } else if (kk == "aliases") {
        const toml::array* a = v.as_array();
        if (!a || a->size() > 64) return invalid_argument(at + ": expected an array of at most 64 strings");
        s->aliases.clear();
        for (auto& e : *a) {
          auto str = e.value<std::string>();
          if (!str || !valid_id(*str)) return invalid_argument(at + ": each alias is a string of 1 to 256 characters");
          s->aliases.push_back(*str);
        }
      } else if (kk == "lora") {
        const toml::array* a = v.as_array();
        if (!a || a->size() > 256)
          return invalid_argument(at + ": expected an array of at most 256 strings \"NAME=FILE[:SCALE]\"");
        s->loras.clear();
        for (auto& e : *a) {
          auto str = e.value<std::string>();
          if (!str) return invalid_argument(at + ": each adapter is a string \"NAME=FILE[:SCALE]\"");
          auto ad = parse_lora_arg(*str);
          if (!ad.ok()) return invalid_argument(at + ": " + ad.status().message());
          if (!valid_id(ad->name))
            return invalid_argument(at + ": " + *str + ": an adapter name is 1 to 256 characters without control characters");
          ad->path = resolve(file, ad->path);
          std::error_code ec;
          if (!fs::is_regular_file(ad->path, ec)) return invalid_argument(at + ": " + *str + ": no such file '" + ad->path + "'");
          s->loras.push_back(std::move(ad.value()));
        }
      } else {
        return invalid_argument(at +
                                ": unknown setting (path, aliases, ctx, kv_memory, chat_template, draft, pinned, lora)");
      }
    }
    if (s == &fresh) {
      if (fresh.path.empty())
        return invalid_argument(where + ": no model of that name in --models-dir or -m, and no path = \"FILE\"");
      specs->push_back(std::move(fresh));
    }
  }
  return {};
}

}  // namespace

Expected<server::RouterModelSpec::Adapter> parse_lora_arg(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    return invalid_argument(text + ": expected NAME=FILE[:SCALE]");
  server::RouterModelSpec::Adapter a;
  a.name = text.substr(0, eq);
  a.path = text.substr(eq + 1);
  if (const size_t colon = a.path.rfind(':'); colon != std::string::npos) {
    const std::string tail = a.path.substr(colon + 1);
    char* end = nullptr;
    const double v = std::strtod(tail.c_str(), &end);
    if (!tail.empty() && end == tail.c_str() + tail.size()) {
      if (!(v >= -100.0 && v <= 100.0)) return invalid_argument(text + ": SCALE must be in [-100, 100]");
      a.scale = (float)v;
      a.path.resize(colon);
    }
  }
  return a;
}

bool is_named_model_arg(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  std::error_code ec;
  return !fs::is_regular_file(arg, ec);
}

Expected<std::vector<server::RouterModelSpec>> build_model_catalog(const std::vector<std::string>& named,
                                                                   const std::string& dir,
                                                                   const std::string& preset) {
  std::vector<server::RouterModelSpec> specs;
  std::set<std::string> names;
  auto add = [&](std::string name, std::string path, const std::string& from) -> Status {
    if (!valid_id(name)) return invalid_argument(from + ": a model name is 1 to 256 characters without control characters");
    if (!names.insert(name).second) return invalid_argument(from + ": two models are named '" + name + "'");
    if (specs.size() >= kMaxModels) return invalid_argument(from + ": more than 1024 models");
    server::RouterModelSpec s;
    s.name = std::move(name);
    s.path = std::move(path);
    specs.push_back(std::move(s));
    return {};
  };
  for (const std::string& arg : named) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size())
      return invalid_argument("-m " + arg + ": expected NAME=FILE in router mode");
    std::error_code ec;
    const std::string path = arg.substr(eq + 1);
    if (!fs::is_regular_file(path, ec)) return invalid_argument("-m " + arg + ": no such file '" + path + "'");
    if (Status st = add(arg.substr(0, eq), path, "-m " + arg); !st.ok()) return st;
  }
  if (!dir.empty()) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return invalid_argument("--models-dir: '" + dir + "' is not a folder");
    std::vector<std::string> files;
    fs::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      if (files.size() > kMaxModels) break;
      const std::string p = it->path().string();
      std::error_code e2;
      if (p.ends_with(".gguf") && fs::is_regular_file(it->path(), e2)) files.push_back(p);
    }
    if (ec) return io_error("--models-dir '" + dir + "': " + ec.message());
    std::sort(files.begin(), files.end());
    for (const std::string& p : files) {
      const std::string name = stem_of(p);
      if (names.count(name)) continue;  // -m NAME=FILE names it already
      if (Status st = add(name, p, "--models-dir " + p); !st.ok()) return st;
    }
  }
  if (!preset.empty())
    if (Status st = apply_preset(preset, &specs); !st.ok()) return st;
  if (specs.empty())
    return invalid_argument(dir.empty() ? "router mode: no model (give -m NAME=FILE, --models-dir or --models-preset)"
                                        : "--models-dir '" + dir + "' holds no *.gguf file");
  return specs;
}

}  // namespace serval::cli
