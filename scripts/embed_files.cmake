# embed_files.cmake: builds a C++ source holding data files (cards, profiles) as string literals,
# so the longseq binary finds its built-in cards from any working directory.
#
# Run as a script: cmake -DOUTPUT=file.cpp -DSYMBOL=name -DFILES="a.yaml;b.yaml" -P embed_files.cmake
# The generated file defines `const longseq::EmbeddedFile SYMBOL[]` and `SYMBOL_count`.
# extern: a namespace-scope const has internal linkage otherwise, and the loaders are elsewhere.
set(body "#include \"io/embedded_files.hpp\"\nnamespace longseq {\nextern const EmbeddedFile ${SYMBOL}[];\nextern const int ${SYMBOL}_count;\nconst EmbeddedFile ${SYMBOL}[] = {\n")
set(count 0)
foreach(path IN LISTS FILES)
  file(READ "${path}" content)
  get_filename_component(file_name "${path}" NAME)
  # A raw string with a delimiter that no card contains; the check keeps it honest.
  string(FIND "${content}" ")longseq_embed\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${path} contains the embedding delimiter")
  endif()
  string(APPEND body "  {\"${file_name}\", R\"longseq_embed(${content})longseq_embed\"},\n")
  math(EXPR count "${count} + 1")
endforeach()
string(APPEND body "};\nconst int ${SYMBOL}_count = ${count};\n}  // namespace longseq\n")
file(WRITE "${OUTPUT}.tmp" "${body}")
# Only touch the output when it changed, so unchanged cards do not trigger rebuilds.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
