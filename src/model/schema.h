/* What the model file schema's two files share (schema.c: the file, a
 * transformer, training: and device:; schema_layers.c: a sequential model's
 * layers). Internal to src/model/. */
#ifndef ML_SCHEMA_H
#define ML_SCHEMA_H

#include "model/model_internal.h"
#include "model/tree.h"

/* model: of type sequential: input, loss and the layers, each layer's
 * shape checked against its input (shape.c). */
ml_status ml_schema_sequential(ml_error *err, const ml_node *mm, ml_model *m);

#endif
