// text_escape.hpp: text from an input, written into what longseq writes. A config.json's
// _name_or_path, a card's strings, a runtime profile's name and every path are input (a config.json
// is downloaded, untrusted), and each file kind longseq writes reads text its own way: a newline or a
// carriage return ends a '#' comment of Python, TOML, shell and YAML (and YAML 1.1 also ends a line
// at U+0085, U+2028 and U+2029); a quote ends a string; an unquoted blank or '$(' is shell syntax;
// bytes that are not UTF-8 are no JSON, YAML or TOML at all. Each function here writes one input
// text into one place of one file kind so that it stays that text: every writer of a file goes
// through them, and no input text reaches a file any other way.
//
// Invariants (tests/io/test_text_escape.cpp; the export fuzz harness checks them on whole files):
// - one_line_text's result is valid UTF-8 with no control character (C0, DEL, C1) and no Unicode
//   line or paragraph separator: it cannot end a comment line or a terminal's line.
// - python_string_literal, toml_basic_string and shell_quote return exactly one token of their
//   language that reads back as utf8_repaired(text) (shell_quote: as the bytes themselves).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace longseq {

// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
bool utf8_valid(std::string_view text);
// The offset of the first byte that is not part of a well-formed UTF-8 sequence, or npos.
size_t utf8_first_invalid_byte(std::string_view text);

// `text` with every byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD.
std::string utf8_repaired(std::string_view text);

// `text` as one printable line: UTF-8 repaired, then \n, \r and \t written as those two characters,
// other control characters and the Unicode line breaks (U+0085, U+2028, U+2029) as \xNN or \uNNNN.
// For comments ('#' in Python, TOML, shell and YAML) and for what is printed to a terminal.
std::string one_line_text(std::string_view text);

// A Python string literal ("..." with ASCII-only escapes) whose value is utf8_repaired(text).
std::string python_string_literal(std::string_view text);

// A TOML basic string ("..." with \" \\ and \uXXXX for control characters) whose value is
// utf8_repaired(text).
std::string toml_basic_string(std::string_view text);

// `word` as one POSIX shell word: as it is when it holds only characters no shell reads specially,
// otherwise single-quoted (a single quote inside as '\''). Its bytes are kept as they are.
std::string shell_quote(std::string_view word);

// A JSON document as text (indent as nlohmann's dump: -1 for one line): strings that are not UTF-8
// are written with U+FFFD for each bad byte instead of throwing, so no input text stops an output.
std::string json_text(const nlohmann::json& document, int indent = 2);

}  // namespace longseq
