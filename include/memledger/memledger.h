/* memledger — plan GPU training memory and FLOPs before launching a job.
 * Umbrella header: model.h (load a model), ledger.h (evaluate one training
 * iteration), plan.h (fit and compare), report.h (text and JSON), error.h
 * (status codes), json.h (the verbs' JSON reports as strings). */
#ifndef MEMLEDGER_MEMLEDGER_H
#define MEMLEDGER_MEMLEDGER_H

#include "calib.h"
#include "error.h"
#include "json.h"
#include "ledger.h"
#include "lengths.h"
#include "model.h"
#include "plan.h"
#include "report.h"
#include "memledger/version.h"

#endif
