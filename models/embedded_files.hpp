// embedded_files.hpp: data files compiled into the binary (see scripts/embed_files.cmake).
#pragma once

#include <span>
#include <string_view>

namespace longseq {

struct EmbeddedFile {
  const char* file_name;  // e.g. "llama-3.1-8b.yaml"
  const char* content;
};

}  // namespace longseq
