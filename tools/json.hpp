// A minimal streaming JSON writer: objects, arrays, strings, numbers, booleans.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace replayssm::tool {

// Writes indented JSON; commas and nesting are tracked, keys are the caller's to pair.
//   json.begin_object().key("batch").integer(64).key("times").begin_array()...
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(const std::string& name);
  JsonWriter& string(const std::string& value);
  JsonWriter& number(double value);  // NaN and infinities are written as null
  JsonWriter& integer(int64_t value);
  JsonWriter& boolean(bool value);
  JsonWriter& numbers(const std::vector<double>& values);  // an array of numbers

 private:
  void start_value();
  void open(char bracket);
  void close(char bracket);
  void newline();

  std::ostream& out_;
  std::vector<bool> has_items_;  // one entry per open object / array
  bool after_key_ = false;
};

}  // namespace replayssm::tool
