/* The simulator's structures checked against each other (alloc.h,
 * ml__alloc_sim_check): for the tests, which call it after every event. */
#include <stdlib.h>

#include "alloc/sim.h"

/* The pairing heap under class k of pool pi: every block free, of the
 * class's size and pool, above its parent's address, linked both ways.
 * Adds its blocks to *count; NULL when consistent. */
static const char *check_heap(const ml_alloc_sim *s, uint32_t k, int pi, uint32_t *queue,
                              size_t room, size_t *count)
{
    const ml_ab *b = s->t.b;
    const uint32_t top = s->ct.k[k].top;
    if (!top)
        return "an empty class in the index";
    if (b[top].hp || b[top].hs)
        return "a heap top with a parent or a sibling";
    size_t n = 0;
    queue[n++] = top;
    for (size_t i = 0; i < n; i++) {
        uint32_t y = queue[i];
        if (b[y].state != ML_AB_FREE || b[y].cls != k || b[y].pool != pi)
            return "a block in a class that is not a free block of it";
        if (b[y].size != s->ct.k[k].size)
            return "a block of another size in a class";
        for (uint32_t c = b[y].hc, prev = y; c; prev = c, c = b[c].hs) {
            if (b[c].hp != prev)
                return "a heap link without its way back";
            if (b[c].addr <= b[y].addr)
                return "a heap child below its parent's address";
            if (n == room)
                return "more blocks in a class than in the table";
            queue[n++] = c;
        }
    }
    *count += n;
    return NULL;
}

static const char *check_pool(const ml_alloc_sim *s, int pi, uint32_t *queue, size_t *classes)
{
    const ml_ab_cls_table *ct = &s->ct;
    const pool_t *p = &s->pool[pi];
    const char *why = ml__ab_classes_check(&p->cls, ct, s->t.n);
    if (why)
        return why;
    size_t count = 0;
    for (uint32_t q = 0; q < p->cls.nch; q++)
        for (uint32_t i = 0; i < p->cls.count[q]; i++) {
            why = check_heap(s, p->cls.ch[p->cls.order[q]].cls[i], pi, queue, s->t.n, &count);
            if (why)
                return why;
            (*classes)++;
        }
    if (count != p->nfree)
        return "a pool's count of free blocks differs from its classes";
    for (size_t m = 0; m < sizeof p->cls.memo / sizeof p->cls.memo[0]; m++) {
        uint32_t k = p->cls.memo[m].cls;
        if (k && (k >= ct->n || !ct->k[k].size || ct->k[k].size != p->cls.memo[m].size ||
                  s->t.b[ct->k[k].top].pool != pi))
            return "a memo entry naming no class of its size";
    }
    return NULL;
}

const char *ml__alloc_sim_check(const ml_alloc_sim *s)
{
    if (!classed(s))
        return NULL; /* the treaps: checked by the differential test's results */
    if (s->ct.cap < s->t.n)
        return "fewer class slots than blocks";
    size_t freed = 0;
    for (size_t i = 1; i < s->t.n; i++)
        freed += s->t.b[i].state == ML_AB_FREE;
    if (freed != s->pool[0].nfree + s->pool[1].nfree)
        return "free blocks outside the classes";
    uint32_t *queue = malloc((s->t.n + 1) * sizeof *queue);
    if (!queue)
        return "out of memory";
    size_t classes = 0;
    const char *why = check_pool(s, SMALL, queue, &classes);
    why = why ? why : check_pool(s, LARGE, queue, &classes);
    free(queue);
    if (!why && classes != s->ct.n - 1 - s->ct.free_count)
        why = "class slots in use that no index holds";
    return why;
}
