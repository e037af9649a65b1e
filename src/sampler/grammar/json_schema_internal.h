// JSON Schema -> GBNF: the compiler's internals (json_schema.cpp,
// json_schema_set.cpp, json_schema_gen.cpp). Not part of the grammar API.
//
// The compiler works in two stages.
//
// 1. Schema -> value set. Every schema (with its base URI and dynamic scope:
//    a "node") is turned into a Set: a finite list of values plus, per JSON
//    type, a union of constrained parts (numbers with bounds, strings with
//    lengths and patterns, arrays and objects whose member constraints are
//    symbolic Terms: conjunctions of nodes, each possibly negated). allOf is
//    intersection, anyOf union, not complement, oneOf and if/then/else are
//    rewritten to those, so every keyword combination has one meaning.
//
//    A Set is always a subset of the schema's true value set: where the
//    exact result cannot be represented (the complement of a regular
//    pattern, two patterns at once, a fractional multipleOf ...) values are
//    dropped and the type is marked inexact; the complement of an inexact
//    type is empty (never the over-approximation). Generating from a subset
//    can only ever produce valid documents.
//
// 2. Set -> grammar. Each Term becomes one GBNF rule (memoized, so
//    recursive schemas are recursive rules); each part becomes one
//    alternative. Generation may narrow further (no undeclared keys where
//    patternProperties apply, bounded integers where multipleOf and bounds
//    meet, ...); it never widens. A Set that generates nothing is an error
//    naming the keyword that emptied it.
//
// The compiler is bounded by GrammarLimits (nesting, size, time) and by the
// part counts below; the value-membership check recurses only as deep as the
// (bounded) enum/const values.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampler/grammar/grammar.h"

namespace serval::json_schema {

using json = nlohmann::ordered_json;  // keeps the declared property order

constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
constexpr size_t kMaxParts = 24;      // parts of one type in one Set
constexpr size_t kMaxTermAtoms = 16;  // atoms of one Term
constexpr size_t kMaxValues = 256;    // finite values of one Set

// One node, possibly negated. Node 0 is the schema `true`, node 1 `false`.
struct Atom {
  uint32_t node = 0;
  bool neg = false;
  auto operator<=>(const Atom&) const = default;
};

// A conjunction of atoms, sorted and unique; empty = any value.
struct Term {
  std::vector<Atom> atoms;
  bool operator==(const Term&) const = default;
  bool any() const { return atoms.empty(); }
};

Term term_and(const Term& a, const Term& b);
Term term_of(uint32_t node, bool neg = false);

enum TypeBit : uint8_t { kNull = 1, kBool = 2, kNum = 4, kStr = 8, kArr = 16, kObj = 32, kAllTypes = 63 };

struct NumPart {
  bool ints = true;   // integer values
  bool fracs = true;  // non-integer values
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_x = false, hi_x = false;  // exclusive bounds
  int64_t mult = 0;                 // ints are multiples of mult (0: any); implies !fracs
  std::vector<double> excl;         // values left out
};

struct StrPart {
  uint32_t min_len = 0, max_len = kUnbounded;  // code points
  std::vector<std::string> patterns;           // each must match (search)
  std::string format;                          // annotation: used as a hint only
  std::vector<std::string> excl;
};

struct ArrLayer {
  std::vector<Term> prefix;  // prefixItems
  Term items;                // every element after the prefix
  bool has_items = false;    // `items` was given (it evaluates the rest)
  bool evaluates = true;     // false for layers made by a complement
};

struct Contains {
  Term c;
  uint32_t min = 1, max = kUnbounded;
};

struct ArrPart {
  std::vector<ArrLayer> layers;  // all apply
  uint32_t min_items = 0, max_items = kUnbounded;
  std::vector<Contains> contains;
  bool unique = false;
  std::vector<json> excl;
};

struct ObjLayer {
  std::vector<std::pair<std::string, Term>> props;     // properties (declared order)
  std::vector<std::pair<std::string, Term>> patterns;  // patternProperties
  Term other;                                          // keys in neither
  bool has_other = false;                              // additionalProperties was given
  bool evaluates = true;                               // false for layers made by a complement
};

struct ObjPart {
  std::vector<ObjLayer> layers;  // all apply
  std::vector<std::string> required;
  uint32_t min_props = 0, max_props = kUnbounded;
  std::vector<Term> names;  // propertyNames
  std::vector<json> excl;
};

struct Set {
  std::vector<json> values;  // finite values other than null / booleans
  bool null_ok = false, true_ok = false, false_ok = false;
  std::vector<NumPart> nums;
  std::vector<StrPart> strs;
  std::vector<ArrPart> arrs;
  std::vector<ObjPart> objs;
  uint8_t inexact = 0;  // TypeBits whose values were dropped
  std::string lost;     // the keyword that first dropped values

  static Set all();
  static Set none() { return Set{}; }
  void drop_types(uint8_t types);  // no values of these TypeBits (flags, parts and finite values)
  bool empty() const {
    return values.empty() && !null_ok && !true_ok && !false_ok && nums.empty() && strs.empty() && arrs.empty() &&
           objs.empty();
  }
};

// A compiled pattern for membership checks (search semantics).
struct RegexProbe {
  Status status;
  GrammarPtr grammar;
};

// A node: one schema location in one dynamic scope.
struct Node {
  const json* schema = nullptr;
  std::string base;    // its base URI
  uint32_t scope = 0;  // dynamic scope id (Compiler::scopes_)
};

class Compiler {
 public:
  // rule_prefix: prepended to the root and every schema-specific rule name
  // (shared primitives such as `space` and `string` keep theirs), so that
  // several schemas' grammars can live in one grammar.
  Compiler(const json& root, const GrammarLimits& lim, std::string rule_prefix = {});
  Expected<std::string> run();

  // --- json_schema_set.cpp: the algebra ---
  Set intersect(const Set& a, const Set& b, const char* kw);
  Set unite(Set a, const Set& b, const char* kw);
  Set complement(const Set& s, const char* kw);
  bool contains(const Set& s, const json& v, int depth = 0);
  bool contains_term(const Term& t, const json& v, int depth);
  const Set& materialize(const Term& t);
  bool regex_search(const std::string& pattern, const std::string& text);
  Term obj_key_term(const ObjPart& p, const std::string& key);
  Term arr_elem_term(const ArrPart& p, size_t i);

 private:
  friend struct SetOps;
  // --- json_schema.cpp: resolution and schema -> Set ---
  void index(const json& s, const std::string& base, size_t depth);
  const json* resolve_ref(const std::string& ref, const std::string& base, std::string& target_base);
  uint32_t node_for(const json* s, const std::string& base, uint32_t scope);
  uint32_t child(uint32_t parent, const json& s);
  const Set& set_of(uint32_t node);
  Set compute_set(uint32_t node);
  Set local_set(const Node& n, const json& s);
  void apply_unevaluated(Set& r, const Node& n, const json& s);
  uint32_t enter_scope(uint32_t scope, const std::string& resource);

  // --- json_schema_gen.cpp: Set -> GBNF ---
  std::string rule_for(const Term& t, const std::string& hint);
  std::string gen_set(const Set& s, const std::string& hint);
  std::string gen_num(const NumPart& p);
  std::string gen_str(const StrPart& p, const std::string& hint);
  std::string gen_arr(const ArrPart& p, const std::string& hint);
  std::string gen_obj(const ObjPart& p, const std::string& hint);
  std::string primitive(const std::string& name);
  std::string add_rule(const std::string& hint, const std::string& body, bool share = true);
  bool term_empty(const Term& t);

 public:
  // Errors: the first one wins.
  void fail(const std::string& where, const std::string& m);
  void exhausted(const std::string& m);
  bool failed() const { return !err_.ok(); }
  bool out_of_time();
  void note_lost(Set& s, uint8_t types, const char* kw);

  const GrammarLimits& lim_;

 private:
  const json& root_;
  std::chrono::steady_clock::time_point start_;
  Status err_;

  std::vector<Node> nodes_;
  std::map<std::tuple<const json*, std::string, uint32_t>, uint32_t> node_ids_;
  std::vector<std::unique_ptr<Set>> sets_;  // per node; null: not computed
  std::vector<char> in_progress_;
  std::map<std::vector<Atom>, std::unique_ptr<Set>> term_sets_;
  std::map<std::vector<Atom>, std::string> term_rules_;
  std::map<std::string, std::unique_ptr<RegexProbe>> regexes_;

  // URI index: absolute URI (with fragment for anchors) -> schema; schema -> base.
  std::map<std::string, const json*> uris_;
  std::unordered_map<const json*, std::string> bases_;
  std::unordered_map<const json*, std::string> resource_of_;  // resource root URI of each indexed schema
  std::map<std::pair<std::string, std::string>, const json*> dyn_anchors_;  // (resource, name) -> schema
  std::vector<std::vector<std::string>> scopes_;                           // dynamic scopes (resources, outermost first)
  std::map<std::vector<std::string>, uint32_t> scope_ids_;
  size_t set_depth_ = 0;

  std::map<std::string, std::string> rules_;  // GBNF rule name -> body
  std::unordered_map<std::string, std::string> rule_of_body_;  // body -> the shared rule (add_rule)
  std::string gen_lost_;                      // the first keyword generation could not honour
  std::string prefix_;                        // rule-name prefix (see the constructor)
  size_t out_bytes_ = 0;
};

// Integer / number grammars (json_schema_gen.cpp), exposed for tests.
std::string int_range_gbnf(int64_t lo, int64_t hi);  // |lo|, |hi| < 10^17; decimal without leading zeros

}  // namespace serval::json_schema
