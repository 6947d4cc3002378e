#pragma once
// The main command's calibration flags: one CLI11 option per field of calib::CalibrationOptions
// (calibration_options.hpp: visit_fields), so a new option needs no code here.
#include <CLI/CLI.hpp>

#include <functional>
#include <list>
#include <string>

#include "headwise/calib/calibration_options.hpp"

namespace headwise::cli {

class CalibrationFlags {
 public:
  // Adds every field's flag to `app`: --kebab-case of its name (or the field's own flag), a
  // switch for a bool or a field with switch_sets, else an option taking the field's text.
  // `after(name)` runs after each field's flag is added (the command's own flags go in between).
  void add_to(CLI::App& app, const std::function<void(std::string_view field)>& after = {});
  // The fields given on the command line, as text (a switch: the text it sets).
  calib::CalibrationRequest request() const;
  // InputError "--model is required (see --help)" for the first kRequired field not given (or
  // given empty); CLI::CallForHelp when none of them is.
  void check_required() const;

 private:
  struct Flag {
    std::string name;
    std::string flag;
    std::string text;  // the option's value (a switch: what it sets)
    bool is_switch = false;
    bool required = false;
    CLI::Option* option = nullptr;
  };
  std::list<Flag> flags_;  // CLI11 keeps pointers to `text`: stable addresses
};

}  // namespace headwise::cli
