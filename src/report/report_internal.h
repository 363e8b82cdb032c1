/* Shared by the report writers. */
#ifndef ML_REPORT_INTERNAL_H
#define ML_REPORT_INTERNAL_H

#include <stdio.h>

#include "memledger/report.h"

/* s as a JSON string, quotes included: '"' and '\' escaped, control
 * characters as \u00XX. */
void ml_json_string(FILE *f, const char *s);

#endif
