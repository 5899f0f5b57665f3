// The program's one error path: every error a command lets through becomes a message naming its
// kind and the documented exit code.
#include "core/errors.hpp"

#include <cstdio>

#include "cli/commands.hpp"

namespace sharpcheck::cli {

int report_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InputError& e) {
    std::fprintf(stderr, "sharpcheck: input error: %s\n", e.what());
    return exit_input_error;
  } catch (const IoError& e) {
    std::fprintf(stderr, "sharpcheck: I/O error: %s\n", e.what());
    return exit_input_error;
  } catch (const PluginCrash& e) {
    std::fprintf(stderr, "sharpcheck: plugin crash: %s\n", e.what());
    return exit_kernel_crash;
  } catch (const Interrupted& e) {
    std::fprintf(stderr, "sharpcheck: %s\n", e.what());
    return 128 + e.signal_number();
  } catch (const UndecidedRounding& e) {
    std::fprintf(stderr, "sharpcheck: undecided rounding (the reference refuses to guess): %s\n", e.what());
    return exit_input_error;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharpcheck: internal error: %s\n", e.what());
    return exit_input_error;
  } catch (...) {
    std::fprintf(stderr, "sharpcheck: internal error (an unknown exception)\n");
    return exit_input_error;
  }
}

}  // namespace sharpcheck::cli
