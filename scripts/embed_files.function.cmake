# longseq_embed_files(OUTPUT SYMBOL FILE...): regenerate OUTPUT (a .cpp) from the data files
# whenever one of them changes, by running embed_files.cmake at build time.
function(longseq_embed_files output symbol)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${output} -DSYMBOL=${symbol} "-DFILES=${ARGN}"
            -P ${PROJECT_SOURCE_DIR}/scripts/embed_files.cmake
    DEPENDS ${ARGN} ${PROJECT_SOURCE_DIR}/scripts/embed_files.cmake
    COMMENT "Embedding ${symbol}"
    VERBATIM)
endfunction()
