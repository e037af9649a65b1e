// The families serval runs: general.architecture -> Family. Adding a family is
// one file in this folder and one line here.
#include "model/family.h"

namespace serval {

extern const Family kLlamaFamily, kQwen2Family, kQwen3Family, kQwen3MoeFamily, kGemma2Family, kGemma3Family,
    kPhi3Family, kGptOssFamily, kBertFamily, kNomicBertFamily;

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {&kLlamaFamily,  &kQwen2Family,  &kQwen3Family, &kQwen3MoeFamily,
                                                 &kGemma2Family, &kGemma3Family, &kPhi3Family,  &kGptOssFamily,
                                                 &kBertFamily,  &kNomicBertFamily};
  return all;
}

const Family* find_family(const std::string& arch) {
  for (const Family* f : families())
    if (arch == f->name) return f;
  return nullptr;
}

}  // namespace serval
