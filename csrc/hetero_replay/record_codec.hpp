// What csrc/codec.cpp shares with other sources: a compressed record's check and decode.
//
// A record is [CRC-32C of the chunk, 4 bytes little-endian][Blosc2 chunk] (csrc/codec.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace hetero_replay {

// One record checked (CRC, chunk structure, decompressed size == row_bytes) and decompressed into
// row; false if damaged (row's bytes are then undefined). Thread-safe (a decoder per thread).
bool decompress_record(const uint8_t* data, size_t size, uint8_t* row, int64_t row_bytes);

}  // namespace hetero_replay
