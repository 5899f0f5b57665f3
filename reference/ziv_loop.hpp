// Ziv's loop, written once for every reference (softmax and its escapes, attention, the matrix
// escapes, both backward passes): passes at growing precision until every result is decided, one
// way of counting them, and a refusal past the cap, never a guess.
//
// Contract: pass(p) is called at p = schedule.initial + guard, then at each ZivSchedule::next, for
// as long as it returns false (some result still undecided); each pass must decide at least what
// the previous one did. When the next precision would pass schedule.cap, the loop throws
// UndecidedRounding("<undecided()> undecided at <cap> bits"): undecided() names what is left and is
// called only then. Statistics, when given: highest_precision is raised to every precision tried;
// escalations counts every pass after the first (the passes that cost more than the first).
#pragma once

#include <algorithm>
#include <string>

#include "core/errors.hpp"
#include "reference/exact_rounding.hpp"

namespace sharpcheck::reference {

template <typename Pass, typename Undecided>
void run_ziv_passes(const ZivSchedule& schedule, mpfr_prec_t guard, ZivStatistics* statistics, Pass&& pass,
                    Undecided&& undecided) {
  const mpfr_prec_t first = schedule.initial + guard;
  for (mpfr_prec_t precision = first;; precision = ZivSchedule::next(precision)) {
    if (precision > schedule.cap) {
      throw UndecidedRounding(std::string(undecided()) + " undecided at " + std::to_string(schedule.cap) +
                              " bits");
    }
    if (statistics != nullptr) {
      if (precision != first) ++statistics->escalations;
      statistics->highest_precision = std::max(statistics->highest_precision, precision);
    }
    if (pass(precision)) return;
  }
}

}  // namespace sharpcheck::reference
