#include "io/embedded_files.hpp"

#include <algorithm>
#include <cctype>

namespace longseq {

std::string text_to_lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string embedded_file_stem(const EmbeddedFile& file) {
  const std::string name = file.file_name;
  return name.substr(0, name.rfind('.'));
}

const EmbeddedFile* embedded_file_find(std::span<const EmbeddedFile> files, const std::string& name) {
  const std::string wanted = text_to_lower(name);
  for (const EmbeddedFile& file : files)
    if (embedded_file_stem(file) == wanted) return &file;
  return nullptr;
}

std::vector<std::string> embedded_file_stems(std::span<const EmbeddedFile> files) {
  std::vector<std::string> stems;
  for (const EmbeddedFile& file : files) stems.push_back(embedded_file_stem(file));
  std::sort(stems.begin(), stems.end());
  return stems;
}

}  // namespace longseq
