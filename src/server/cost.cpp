#include "server/cost.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace serval::server {

Expected<PriceTable> PriceTable::parse(const std::string& text) {
  using json = nlohmann::json;
  if (text.size() > (1u << 20)) return invalid_argument("price table: larger than 1 MiB");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("price table: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return invalid_argument("price table: expected an object {model: {input_per_million, output_per_million}}");
  if (j.size() > 4096) return invalid_argument("price table: more than 4096 models");
  PriceTable t;
  for (const auto& [model, p] : j.items()) {
    if (!p.is_object()) return invalid_argument("price table: '" + model + "': expected an object");
    Price pr;
    for (const auto& [k, v] : p.items()) {
      if (k != "input_per_million" && k != "output_per_million")
        return invalid_argument("price table: '" + model + "': unknown field '" + k +
                                "' (expected input_per_million, output_per_million)");
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 || v.get<double>() > 1e9)
        return invalid_argument("price table: '" + model + "." + k + "': expected a number in [0, 1e9]");
      (k == "input_per_million" ? pr.input_per_million : pr.output_per_million) = v.get<double>();
    }
    t.prices_[model] = pr;
  }
  return t;
}

std::optional<Price> PriceTable::find(const std::string& model) const {
  if (auto it = prices_.find(model); it != prices_.end()) return it->second;
  if (auto it = prices_.find("*"); it != prices_.end()) return it->second;
  return std::nullopt;
}

double PriceTable::cost(const std::string& model, int64_t prompt_tokens, int64_t completion_tokens) const {
  const auto p = find(model);
  if (!p) return 0;
  return ((double)prompt_tokens * p->input_per_million + (double)completion_tokens * p->output_per_million) / 1e6;
}

EnergyModel::EnergyModel(EnergyConfig cfg) : cfg_(std::move(cfg)) {
  if (cfg_.use_rapl)
    if (auto j = rapl_joules()) {
      rapl_ok_ = true;
      rapl_start_j_ = *j;
    }
}

std::optional<double> EnergyModel::rapl_joules() const {
  std::ifstream in(cfg_.rapl_path);
  long long uj = -1;
  if (!(in >> uj) || uj < 0) return std::nullopt;
  return (double)uj * 1e-6;
}

double EnergyModel::joules(double compute_s, double busy_s) {
  if (!rapl_ok_) return compute_s * cfg_.n_threads * cfg_.watts_per_core;
  // Package power while the engine is busy: RAPL joules over engine step
  // seconds, re-measured at most once a second (the counter wraps: a
  // negative delta restarts the measurement).
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now - last_sample_ns_ > 1'000'000'000) {
    last_sample_ns_ = now;
    if (auto j = rapl_joules()) {
      const double dj = *j - rapl_start_j_, ds = busy_s - busy_start_s_;
      if (dj < 0) {
        rapl_start_j_ = *j;
        busy_start_s_ = busy_s;
      } else if (ds > 0.05) {
        watts_ = dj / ds;
      }
    }
  }
  const double w = watts_ > 0 ? watts_ : cfg_.n_threads * cfg_.watts_per_core;
  return compute_s * w;
}

}  // namespace serval::server
