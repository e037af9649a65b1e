// The lattice codebooks ("grids") of the IQ1_S/IQ1_M, IQ2_XXS/IQ2_XS/IQ2_S and
// IQ3_XXS/IQ3_S formats, as the GGUF format defines them (ggml's iq*_grid
// tables): entry i holds 8 (IQ1, IQ2) or 4 (IQ3) values, element j in byte j
// of the little-endian word. Pure data, expanded at compile time from the
// compact codes in iq_grids.cpp; thread-safe to read.
//
//   grid      entries  values per entry  magnitudes
//   kIq2xxs   256      8                 8, 25, 43
//   kIq2xs    512      8                 8, 25, 43
//   kIq2s     1024     8                 8, 25, 43
//   kIq3xxs   256      4                 4, 12, 20, 28, 36, 44, 52, 62
//   kIq3s     512      4                 1, 3, 5, ..., 15
//   kIq1s     2048     8                 -1, 0, 1 (int8)
#pragma once

#include <array>
#include <cstdint>

namespace serval {

extern const std::array<uint64_t, 256> kIq2xxsGrid;
extern const std::array<uint64_t, 512> kIq2xsGrid;
extern const std::array<uint64_t, 1024> kIq2sGrid;
extern const std::array<uint32_t, 256> kIq3xxsGrid;
extern const std::array<uint32_t, 512> kIq3sGrid;
extern const std::array<uint64_t, 2048> kIq1sGrid;  // bytes are int8 (-1 = 0xFF)

inline const uint64_t* iq2xxs_grid() { return kIq2xxsGrid.data(); }
inline const uint64_t* iq2xs_grid() { return kIq2xsGrid.data(); }
inline const uint64_t* iq2s_grid() { return kIq2sGrid.data(); }
inline const uint32_t* iq3xxs_grid() { return kIq3xxsGrid.data(); }
inline const uint32_t* iq3s_grid() { return kIq3sGrid.data(); }
inline const uint64_t* iq1s_grid() { return kIq1sGrid.data(); }

}  // namespace serval
