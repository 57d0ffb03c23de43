// shell_words.hpp: a POSIX shell's reading of one line, for tests of the text longseq writes for
// a shell (mpirun command lines, Slurm batch scripts). It accepts only what shell_quote writes:
// words of plain characters, single-quoted runs, backslash escapes, separated by spaces. Any other
// character outside quotes (a ';', '$', '`', '|', '&', a newline...) is a shell construct, and the
// reading fails: that is exactly what a hostile input must never produce.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace longseq::test {

// The words a shell would pass to the command, or nullopt (with `problem` set) when the line
// holds an unquoted shell construct or an unterminated quote.
inline std::optional<std::vector<std::string>> shell_words(const std::string& line, std::string* problem = nullptr) {
  auto fail = [&](const std::string& why) -> std::optional<std::vector<std::string>> {
    if (problem) *problem = why;
    return std::nullopt;
  };
  static const std::string plain = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+%@";
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else if (c == '\'') {
      const size_t end = line.find('\'', i + 1);
      if (end == std::string::npos) return fail("an unterminated single quote");
      word.append(line, i + 1, end - i - 1);
      in_word = true;
      i = end;
    } else if (c == '\\') {
      if (i + 1 >= line.size()) return fail("a backslash at the end of the line");
      word.push_back(line[++i]);
      in_word = true;
    } else if (plain.find(c) != std::string::npos || static_cast<unsigned char>(c) >= 0x80) {
      word.push_back(c);
      in_word = true;
    } else {
      return fail("an unquoted shell character '" + std::string(1, c) + "' at column " + std::to_string(i + 1));
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// The lines of `text` (split at '\n'; a final newline ends the last line).
inline std::vector<std::string> text_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return lines;
}

}  // namespace longseq::test
