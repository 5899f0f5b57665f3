# Read by ctest after the unit tests are discovered (tests/CMakeLists.txt appends it to the
# directory's TEST_INCLUDE_FILES): every discovered unit test (gtest_discover_tests leaves each
# executable's list in a variable <executable>_TESTS) is `quick` but the heavy ones named here.
# (ctest appends labels rather than replacing them, so they are given once, here.) Costs are
# ctest's measured seconds on 2 cores; a test named here that no longer exists is ignored.
#   exhaustive (left out of the default run; CI runs it): sweeps over every float, a million
#   inputs, or a whole study's figures.
#   slow (in the default run, not in quick): a few seconds to a minute each.
set(sharpcheck_exhaustive_tests
  NonpositiveExp.MeetsItsContractOnEveryFloatFromMinus104ToZero            # 60 s
  DispersionStudy.TheDefaultStudysNumbersShowDispersionAndItsEscapes       # 55 s
  Stages.BallsThenMpfrEqualMpfrAloneOnAMillionElementsPerFormat            # 24 s
  DoubleStage.CertifiedExpStaysWithinItsProvenBoundOnAMillionInputsAndTheReductionsWorstCases  # 10 s
  Fp8Spread.TheLogitsHaveTheAskedSpread                                    # 10 s
  Fp8Spread.ErrorGrowsWithTheSpread                                        # 10 s
  Fp8Spread.RotationHelpsOnOutliersAtSmallSpreadsAndNotWithoutOutliers     # 10 s
  Fp8Spread.LazyRescalingSaturatesAndTheOthersNever                        # 10 s
  # Every forward kernel x every recipe on every gate problem (45 to 55 s quiet, the default run's
  # second-largest entry after the gate's own job, which runs the same kernels on the same problems
  # under the default recipes and fails on any honest kernel's failure or twin's pass).
  RecipeDesigns.ForwardKernelsFitTheirRecipeAndTheDefaultAndNoTwinFitsAny
  # The backward's sweeps of every kernel over every recipe or case (7.5, 8, 5.5 and 6 s quiet; the
  # gate's own job runs the same kernels on the backward cases): the default run measured 307 s
  # quiet with them, over the 5-minute target.
  RecipeDesigns.BackwardKernelsFitTheirRecipeAndNoTwinFitsADefaultRecipe
  RecipeDesigns.AGradientScaledByTenPercentFitsNotTheMathPathsRecipe
  AttentionBackwardKernels.HonestKernelsPassEveryCase
  AttentionBackwardKernels.EveryBrokenTwinFailsACaseAndSharpcheckCatchesWhatPeersCatch)
set(sharpcheck_slow_tests
  RecipeDesigns.AFivePercentScaleFitsNoBackwardRecipeAtAWideHead           # 4 s
  Bounds.Proposition31HoldsForRandomWeightsInOneToSixtyFourDimensions
  DenominatorStall.Bf16AndFp16RunningSumsStallWhereTheirPrecisionEnds
  DenominatorStall.RandomRowsDegradeWithNInBf16ButNotInFp32
  DenominatorStall.SequentialSumsStallAtTheHorizonBoundsComputes
  DenominatorStall.PairwiseAndKahanInBf16AvoidTheStall
  DispersionStudy.LinearAndDifferentialDisperseSelectiveEscapes)
get_cmake_property(sharpcheck_variables VARIABLES)
foreach(sharpcheck_variable IN LISTS sharpcheck_variables)
  if(NOT sharpcheck_variable MATCHES "_test_TESTS$")
    continue()
  endif()
  foreach(sharpcheck_test IN LISTS ${sharpcheck_variable})
    # list(FIND), not if(IN_LIST): ctest reads this file under old policies.
    list(FIND sharpcheck_exhaustive_tests ${sharpcheck_test} sharpcheck_exhaustive)
    list(FIND sharpcheck_slow_tests ${sharpcheck_test} sharpcheck_slow)
    if(sharpcheck_exhaustive GREATER -1)
      set_tests_properties(${sharpcheck_test} PROPERTIES LABELS exhaustive)
    elseif(sharpcheck_slow GREATER -1)
      set_tests_properties(${sharpcheck_test} PROPERTIES LABELS slow)
    else()
      set_tests_properties(${sharpcheck_test} PROPERTIES LABELS quick)
    endif()
  endforeach()
endforeach()
