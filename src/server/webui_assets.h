// The browser UI's files, embedded in the binary at build time: the table is
// defined by a generated source (web/scripts/embed.mjs, run by CMake when a
// file under web/ changed), or by an empty stub when the build had no npm or
// SERVAL_WEBUI=OFF.
#pragma once

#include <cstddef>

namespace serval::server::webui {

struct Asset {
  const char* path;          // "/index.html", "/assets/index-<hash>.js"
  const char* content_type;
  const unsigned char* data;
  size_t size;
  const unsigned char* gz;   // the same bytes gzipped (level 9)
  size_t gz_size;
  bool immutable;            // content-hashed name: cached for a year
};

extern const Asset kAssets[];
extern const size_t kAssetCount;

}  // namespace serval::server::webui
