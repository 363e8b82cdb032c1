/* The calibration line plan's text and the HTML report print alike
 * (ml__report_calibration, report_internal.h): the profile, what it
 * measured and how the step is timed (docs/calibration.md). */
#include <stdio.h>

#include "memledger/calib.h"
#include "report/report_internal.h"

void ml__report_calibration(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    const char *dev = ml_profile_get(cfg->calib, "device");
    const char *pp = ml_profile_get(cfg->calib, "precision");
    fprintf(f, "calibration: profile %s (%s, %s): ", ml_profile_get(cfg->calib, "name"),
            *dev ? dev : "device not recorded", *pp ? pp : ml_profile_get(cfg->calib, "dtype"));
    if (s->calibrated_blocks)
        fprintf(f, "measured c = %.3f for %zu blocks (marked *; %s)", s->calibrated_c,
                s->calibrated_blocks,
                s->calibrated_at_shape ? "measured at this seq_len and hidden"
                                       : "extrapolated by the profile's fit from other shapes");
    else
        fprintf(f, "analytic c, since %s",
                s->calibration_note ? s->calibration_note : "no block can take it");
    fprintf(f, "; step time %s",
            s->time.source == ML_TIME_CALIBRATED ? "per op, at the profile's GEMM rates"
            : s->time_measured                  ? "from the measured GEMM throughput"
                                                : "analytic");
}
