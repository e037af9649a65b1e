// Cost and energy attribution per request.
//
// PriceTable: per-model prices per million input (prompt) and output
// (generated) tokens, from a JSON file:
//   {"stories260K": {"input_per_million": 0.10, "output_per_million": 0.40},
//    "*":          {"input_per_million": 0.05, "output_per_million": 0.20}}
// ("*" applies to models not listed). Prices are in one currency (the
// metrics call it USD).
//
// EnergyModel: joules of a request = its share of engine step wall time
// (RequestTiming::compute_s) x compute threads x watts per core; or, with RAPL
// (/sys/class/powercap/intel-rapl:*/energy_uj readable), x the package power
// measured over the engine's busy time. Carbon = joules / 3.6e6 x grid
// intensity (g CO2e per kWh).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/status.h"

namespace serval::server {

struct Price {
  double input_per_million = 0, output_per_million = 0;
};

class PriceTable {
 public:
  // Bounded: at most 1 MiB of text and 4096 models; prices finite and >= 0.
  static Expected<PriceTable> parse(const std::string& json_text);
  bool empty() const { return prices_.empty(); }
  // nullopt when neither the model nor "*" has a price.
  std::optional<Price> find(const std::string& model) const;
  double cost(const std::string& model, int64_t prompt_tokens, int64_t completion_tokens) const;

 private:
  std::map<std::string, Price> prices_;
};

struct EnergyConfig {
  double watts_per_core = 0;      // 0: no CPU-time estimate
  int n_threads = 1;              // compute threads of the engine
  double grid_g_per_kwh = 0;      // carbon intensity; 0: no carbon figure
  bool use_rapl = false;          // measure package power when readable
  std::string rapl_path = "/sys/class/powercap/intel-rapl:0/energy_uj";
};

class EnergyModel {
 public:
  explicit EnergyModel(EnergyConfig cfg);
  bool enabled() const { return cfg_.watts_per_core > 0 || rapl_ok_; }
  bool rapl() const { return rapl_ok_; }
  // Joules for a request that used compute_s of engine step time. busy_s is
  // the engine's total step time so far (for the RAPL power estimate).
  double joules(double compute_s, double busy_s);
  double carbon_grams(double joules) const { return joules / 3.6e6 * cfg_.grid_g_per_kwh; }
  // RAPL package energy counter in joules (nullopt when not readable).
  std::optional<double> rapl_joules() const;

 private:
  EnergyConfig cfg_;
  bool rapl_ok_ = false;
  std::mutex mu_;
  double rapl_start_j_ = 0, busy_start_s_ = 0, watts_ = 0;
  int64_t last_sample_ns_ = 0;
};

}  // namespace serval::server
