# Reads the pins from versions.env so that CMake, tools/setup.sh and the Python tools agree.
file(STRINGS ${PROJECT_SOURCE_DIR}/versions.env HEADWISE_PINS REGEX "^[A-Z_]+=")
foreach(line IN LISTS HEADWISE_PINS)
  string(REGEX MATCH "^([A-Z_]+)=\"?([^\"]*)\"?$" _ "${line}")
  set(HEADWISE_PIN_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
endforeach()
