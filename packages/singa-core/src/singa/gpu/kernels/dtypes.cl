/* What every program of every GPU backend starts with, after the backend's prelude (which defines `half`,
 * vload_half / vstore_half_rte and sg_acc): the strided-layout struct and element access by dtype. singa.gpu.table's
 * source_of puts it in front of each program's source. */

#define SG_MAXD 8 /* dimensions of a strided walk; singa.gpu.table splits longer layouts */

/* a strided element-wise layout: the shape, then each operand's strides in elements (operand 0 is the output) */
typedef struct {
    long nd;
    long shape[SG_MAXD];
    long st[4][SG_MAXD];
} sg_dims;

/* element access by dtype: float16 through the prelude's conversions, bool as uchar 0/1 */
#define SG_LD_F32(p, i) ((p)[i])
#define SG_ST_F32(p, i, v) ((p)[i] = (float)(v))
#define SG_LD_F16(p, i) vload_half((i), (p))
#define SG_ST_F16(p, i, v) vstore_half_rte((float)(v), (i), (p))
/* rounded once from the accumulator type (double where the device has it), like the CPU backend's
 * (_Float16)double */
#define SG_ST_F16_ACC(p, i, v) vstore_half_rte((sg_acc)(v), (i), (p))
#define SG_LD_F64(p, i) ((p)[i]) /* float64 programs are built only for devices that declare float64 */
#define SG_ST_F64(p, i, v) ((p)[i] = (double)(v))
#define SG_LD_I32(p, i) ((p)[i])
#define SG_ST_I32(p, i, v) ((p)[i] = (int)(v))
#define SG_LD_I64(p, i) ((p)[i])
#define SG_ST_I64(p, i, v) ((p)[i] = (long)(v))
#define SG_LD_BOOL(p, i) ((int)((p)[i] != 0))
#define SG_ST_BOOL(p, i, v) ((p)[i] = (uchar)((v) != 0))
