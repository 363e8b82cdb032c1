/* Private to the calibration profile (profile.c, profile_read.c): the lists
 * a profile's YAML is written from and checked against. */
#ifndef ML_PROFILE_INTERNAL_H
#define ML_PROFILE_INTERNAL_H

/* The metadata keys, each a string, in the order a profile is written. */
#define ML_PROFILE_NMETA 9
extern const char *const ml__profile_meta_keys[ML_PROFILE_NMETA];

#endif
