#include "json.hpp"

#include <cmath>
#include <cstdio>

namespace replayssm::tool {
namespace {

void write_escaped(std::ostream& out, const std::string& text) {
  out << '"';
  for (const char c : text) {
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\n': out << "\\n"; break;
      case '\t': out << "\\t"; break;
      case '\r': out << "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char code[8];
          std::snprintf(code, sizeof code, "\\u%04x", c);
          out << code;
        } else {
          out << c;
        }
    }
  }
  out << '"';
}

}  // namespace

void JsonWriter::newline() {
  out_ << '\n' << std::string(2 * has_items_.size(), ' ');
}

void JsonWriter::start_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_items_.empty()) {
    if (has_items_.back()) out_ << ',';
    has_items_.back() = true;
    newline();
  }
}

void JsonWriter::open(char bracket) {
  start_value();
  out_ << bracket;
  has_items_.push_back(false);
}

void JsonWriter::close(char bracket) {
  const bool had_items = has_items_.back();
  has_items_.pop_back();
  if (had_items) newline();
  out_ << bracket;
  if (has_items_.empty()) out_ << '\n';
}

JsonWriter& JsonWriter::begin_object() {
  open('{');
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  close('}');
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  open('[');
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  close(']');
  return *this;
}

JsonWriter& JsonWriter::key(const std::string& name) {
  start_value();
  write_escaped(out_, name);
  out_ << ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::string(const std::string& value) {
  start_value();
  write_escaped(out_, value);
  return *this;
}

JsonWriter& JsonWriter::number(double value) {
  start_value();
  if (!std::isfinite(value)) {
    out_ << "null";
    return *this;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.7g", value);
  out_ << text;
  return *this;
}

JsonWriter& JsonWriter::integer(int64_t value) {
  start_value();
  out_ << value;
  return *this;
}

JsonWriter& JsonWriter::boolean(bool value) {
  start_value();
  out_ << (value ? "true" : "false");
  return *this;
}

JsonWriter& JsonWriter::numbers(const std::vector<double>& values) {
  begin_array();
  for (const double v : values) number(v);
  return end_array();
}

}  // namespace replayssm::tool
