// json_schema_check.cpp: holds a JSON document (standard input) to a JSON Schema file (argv[1]), for
// the tests that every `--json` output keeps its documented shape (docs/json/). It reads the subset
// of JSON Schema 2020-12 the schemas use: type, properties, required, additionalProperties, items,
// enum, const, minimum, anyOf and local $ref (#/$defs/NAME); any other keyword in a schema is an
// error, so a schema cannot lean on a rule this checker would skip. Exit 0 and "valid", or 1 and
// each violation with its JSON pointer.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

struct Checker {
  const json& root;
  std::vector<std::string> violations;

  static bool has_type(const json& value, const std::string& type) {
    if (type == "object") return value.is_object();
    if (type == "array") return value.is_array();
    if (type == "string") return value.is_string();
    if (type == "integer") return value.is_number_integer();
    if (type == "number") return value.is_number();
    if (type == "boolean") return value.is_boolean();
    if (type == "null") return value.is_null();
    throw std::runtime_error("schema: unknown type '" + type + "'");
  }

  const json& resolve(const std::string& reference) const {
    const std::string prefix = "#/$defs/";
    if (reference.rfind(prefix, 0) != 0) throw std::runtime_error("schema: only #/$defs/NAME references are read, got " + reference);
    return root.at("$defs").at(reference.substr(prefix.size()));
  }

  // Whether `value` meets `schema`, violations recorded under `where` unless `quiet` (anyOf's trials).
  bool check(const json& value, const json& schema, const std::string& where, bool quiet = false) {
    static const std::set<std::string> known = {"$schema", "$id", "title", "description", "type", "properties", "required",
                                                "additionalProperties", "items", "enum", "const", "minimum", "anyOf", "$ref", "$defs"};
    bool ok = true;
    auto fail = [&](const std::string& what) {
      ok = false;
      if (!quiet) violations.push_back((where.empty() ? "/" : where) + ": " + what);
    };
    for (const auto& [keyword, _] : schema.items())
      if (!known.count(keyword)) throw std::runtime_error("schema: keyword '" + keyword + "' at " + where + " is not read by this checker");
    if (schema.contains("$ref") && !check(value, resolve(schema["$ref"]), where, quiet)) ok = false;
    if (schema.contains("anyOf")) {
      bool any = false;
      for (const json& option : schema["anyOf"]) any = any || check(value, option, where, true);
      if (!any) fail("matches none of anyOf's schemas");
    }
    if (schema.contains("type")) {
      const json& type = schema["type"];
      bool matched = false;
      for (const json& one : type.is_array() ? type : json::array({type})) matched = matched || has_type(value, one.get<std::string>());
      if (!matched) fail("expected " + type.dump() + ", got " + value.dump().substr(0, 80));
    }
    if (schema.contains("const") && value != schema["const"]) fail("expected " + schema["const"].dump() + ", got " + value.dump().substr(0, 80));
    if (schema.contains("enum")) {
      bool listed = false;
      for (const json& option : schema["enum"]) listed = listed || value == option;
      if (!listed) fail(value.dump().substr(0, 80) + " is not one of " + schema["enum"].dump());
    }
    if (schema.contains("minimum") && value.is_number() && value.get<double>() < schema["minimum"].get<double>())
      fail(value.dump() + " is below the minimum " + schema["minimum"].dump());
    if (value.is_object()) {
      if (schema.contains("required"))
        for (const json& key : schema["required"])
          if (!value.contains(key.get<std::string>())) fail("the key '" + key.get<std::string>() + "' is missing");
      const json properties = schema.value("properties", json::object());
      for (const auto& [key, member] : value.items()) {
        if (properties.contains(key)) {
          if (!check(member, properties[key], where + "/" + key, quiet)) ok = false;
        } else if (schema.contains("additionalProperties")) {
          const json& extra = schema["additionalProperties"];
          if (extra.is_boolean() && !extra.get<bool>()) fail("the key '" + key + "' is not in the schema");
          else if (extra.is_object() && !check(member, extra, where + "/" + key, quiet)) ok = false;
        }
      }
    }
    if (value.is_array() && schema.contains("items"))
      for (size_t i = 0; i < value.size(); ++i)
        if (!check(value[i], schema["items"], where + "/" + std::to_string(i), quiet)) ok = false;
    return ok;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: json_schema_check SCHEMA.json < DOCUMENT.json\n";
    return 2;
  }
  try {
    std::ifstream schema_file(argv[1]);
    if (!schema_file) throw std::runtime_error(std::string("cannot read ") + argv[1]);
    const json schema = json::parse(schema_file);
    const json document = json::parse(std::cin);
    Checker checker{schema, {}};
    checker.check(document, schema, "");
    if (checker.violations.empty()) {
      std::cout << "valid\n";
      return 0;
    }
    for (const std::string& violation : checker.violations) std::cout << "violation: " << violation << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "json_schema_check: " << error.what() << "\n";
    return 2;
  }
}
