#include <doctest/doctest.h>

#include "models/model_loader.hpp"

TEST_CASE("placeholder") { CHECK(longseq::parameter_count(longseq::model_load("llama-3.1-8b")).total == 8030261248); }
