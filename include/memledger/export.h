/* memledger — symbol visibility for the public API. */
#ifndef MEMLEDGER_EXPORT_H
#define MEMLEDGER_EXPORT_H

#if defined(ML_BUILDING) && defined(__GNUC__)
#define ML_API __attribute__((visibility("default")))
#else
#define ML_API
#endif

#endif
