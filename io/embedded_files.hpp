// embedded_files.hpp: data files compiled into the binary (see scripts/embed_files.cmake), and
// the lookup by name that the model, hardware and profile loaders share.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace longseq {

struct EmbeddedFile {
  const char* file_name;  // e.g. "llama-3.1-8b.yaml"
  const char* content;
};

// "llama-3.1-8b.yaml" -> "llama-3.1-8b": the name users type.
std::string embedded_file_stem(const EmbeddedFile& file);

// The file whose stem equals `name` case-insensitively, or nullptr.
const EmbeddedFile* embedded_file_find(std::span<const EmbeddedFile> files, const std::string& name);

// Stems, sorted, for listings and "known names" in error messages.
std::vector<std::string> embedded_file_stems(std::span<const EmbeddedFile> files);

std::string text_to_lower(std::string text);

}  // namespace longseq
