// fuzz_harness.hpp: the contract every parser's fuzz harness checks. A parser given any bytes
// either returns a value or throws ConfigError (bad input, reported to the user with exit 2);
// any other exception, a crash, a hang or a sanitizer report is a bug. libFuzzer drives the
// harnesses (scripts/fuzz.sh run); replay_main.cpp runs the same function over the seed and
// regression files in CTest, so every crash found stays fixed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "io/config_error.hpp"

// Defines LLVMFuzzerTestOneInput around BODY, which reads `text` (the input as a string).
#define LONGSEQ_FUZZ_TARGET(BODY)                                                              \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {                    \
    const std::string text(reinterpret_cast<const char*>(data), size);                         \
    try {                                                                                      \
      BODY                                                                                     \
    } catch (const longseq::ConfigError&) {                                                    \
    } catch (const std::exception& error) {                                                    \
      std::fprintf(stderr, "fuzz: an exception that is not a ConfigError: %s\n", error.what()); \
      std::abort();                                                                            \
    }                                                                                          \
    return 0;                                                                                  \
  }
