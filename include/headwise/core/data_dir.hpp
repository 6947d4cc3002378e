#pragma once
// Where headwise's shipped data (calib-data/: the haystack text of the generators) lives, so an
// installed binary works from any folder: HEADWISE_DATA_DIR when set; else <prefix>/share/headwise
// next to the running binary (bin/../share/headwise, what `cmake --install` lays out); else, for
// a binary that runs from its own build tree, the source tree it was built from.
#include <filesystem>

namespace headwise {

// Throws InputError naming HEADWISE_DATA_DIR and the places looked at when none holds calib-data/.
std::filesystem::path data_dir();

}  // namespace headwise
