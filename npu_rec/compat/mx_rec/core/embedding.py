"""mx_rec.core.embedding: `create_table` and `sparse_lookup` over npu_rec's tables.

mx_rec sets a table's admission and eviction with the lookups (the
`FeatureSpec` or `access_and_evict_config`) and its optimizer when the
optimizer applies gradients. npu_rec's table therefore comes to life at the
first lookup (`HashTable.core`), with the thresholds that lookup gives; its
optimizer is bound later (`npu_rec.SparseTable.bind_optimizer`).
"""

from __future__ import annotations

import re
import weakref

import tensorflow as tf

import npu_rec
from npu_rec._compat import keep_out_of_meta_graphs
from npu_rec.compat.mx_rec import _saver, _sessions
from npu_rec.compat.mx_rec.constants import constants as _c
from npu_rec.compat.mx_rec.core.asc.feature_spec import FeatureSpec
from npu_rec.table._base import SparseTable
from npu_rec.table._rounding import check_value_dtype

_NO_CPU_MEANING = (
    "is_dp",
    "all2all_gradients_op",
    "enable_merge",
    "fusion_optimizer_var",
    "hashtable_threshold",
)


class HashTable:
    """An mx_rec sparse table: an npu_rec `SparseTable` made at the first lookup.

    Attributes:
      table_name: The table's name (also `name`).
      key_dtype, dim (int), capacity_rows, value_dtype: as given to `create_table`.
    """

    def __init__(
        self,
        name,
        dim,
        key_dtype,
        initializer,
        capacity,
        num_shards,
        optimizer,
        value_dtype=tf.float32,
        tier=None,
    ):
        self.table_name = self.name = name
        self.value_dtype = value_dtype
        self.dim = dim
        self.key_dtype = key_dtype
        self._initializer = initializer
        self.capacity_rows = capacity
        self._num_shards = num_shards
        self._optimizer = optimizer
        # One npu_rec table per graph (an Estimator builds a graph per call), or eager.
        self._cores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._eager_core: SparseTable | None = None
        self._last: SparseTable | None = None
        self._thresholds: tuple[int, int] | None = None
        self._capacity_ops: dict[int, tf.Tensor] = {}
        #: `create_table` keywords of an SSD tier (`memory_rows`, `ssd_path`), or {}.
        self._tier = dict(tier or {})

    @staticmethod
    def _graph():
        with tf.init_scope():
            return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()

    def _current(self) -> SparseTable | None:
        graph = self._graph()
        return self._eager_core if graph is None else self._cores.get(graph)

    def core_table(self, access_threshold=None, eviction_threshold=None) -> SparseTable:
        """The npu_rec table of the current graph, made now at its first lookup.

        Raises:
          ValueError: a lookup asks for other thresholds than the first one.
        """
        wanted = (
            -1 if access_threshold is None else int(access_threshold),
            -1 if eviction_threshold is None else int(eviction_threshold),
        )
        if self._thresholds is not None and wanted not in (self._thresholds, (-1, -1)):
            raise ValueError(
                f"Table {self.table_name!r} was first looked up with access_threshold="
                f"{self._thresholds[0]}, eviction_threshold={self._thresholds[1]}; one table has "
                f"one admission setting. Received: access_threshold={wanted[0]}, "
                f"eviction_threshold={wanted[1]}"
            )
        if self._thresholds is None or wanted != (-1, -1):
            self._thresholds = wanted
        core = self._current()
        if core is not None:
            return core
        core = npu_rec.create_table(
            self.table_name,
            self.dim,
            key_dtype=self.key_dtype,
            initializer=self._initializer,
            optimizer=self._optimizer,
            capacity=self.capacity_rows,
            access_threshold=self._thresholds[0],
            eviction_threshold=self._thresholds[1],
            num_shards=self._num_shards,
            value_dtype=self.value_dtype,
            **self._tier,
        )
        _saver.COMPAT_TABLES.add(core)
        graph = self._graph()
        if graph is None:
            self._eager_core = core
        else:
            self._cores[graph] = core
            with tf.init_scope():  # before a MonitoredTrainingSession finalises the graph
                self._capacity_ops[id(core)] = tf.add_n([s.storage.capacity() for s in core.shards])
        self._last = core
        return core

    @property
    def core(self) -> SparseTable:
        """The npu_rec table of the current graph (else the newest one; made if none)."""
        return self._current() or self._last or self.core_table()

    def _read(self, tensor_of, session):
        core = self.core
        if tf.executing_eagerly() and not core._graph_mode:
            return int(tensor_of(core))
        graph = tf.compat.v1.get_default_graph() if session is None else session.graph
        sess = session or _sessions.session_for(graph)
        if sess is None:
            raise ValueError(
                f"Table {self.table_name!r} lives in a tf.compat.v1 graph: reading it needs a "
                "session of that graph (pass session=, or make the session first). "
                "Received: no open session"
            )
        with graph.as_default():
            return int(sess.run(tensor_of(core)))

    def size(self, session=None) -> int:
        """Keys holding a row (an int; read in `session`, the default or newest one)."""
        return self._read(lambda t: t._graph_ops["size"] if t._graph_mode else t.size(), session)

    def capacity(self, session=None) -> int:
        """Rows allocated (an int): the capacity, grown by dynamic expansion."""
        if self._last is None:
            return self.capacity_rows

        def total(core):
            if not core._graph_mode:
                return tf.add_n([s.storage.capacity() for s in core.shards])
            return self._capacity_ops[id(core)]

        return self._read(total, session)

    def __repr__(self):
        return f"HashTable(table_name={self.table_name!r}, dim={self.dim})"


def _dim(dim) -> int:
    if isinstance(dim, tf.TensorShape):
        if dim.rank != 1 or dim[0] is None:
            raise ValueError(
                f"`dim` as a tf.TensorShape must have one known dimension. Received: dim={dim}"
            )
        return int(dim[0])
    return dim


def create_table(
    key_dtype,
    dim,
    name,
    emb_initializer,
    device_vocabulary_size=1,
    host_vocabulary_size=0,
    ssd_vocabulary_size=0,
    ssd_data_path=None,
    is_save=True,
    is_dp=False,
    init_param=1.0,
    all2all_gradients_op="sum_gradients",
    enable_merge=False,
    padding_keys=None,
    padding_keys_mask=False,
    padding_keys_len=None,
    value_dtype=tf.float32,
    shard_num=1,
    fusion_optimizer_var=True,
    hashtable_threshold=0,
    **kwargs,
) -> HashTable:
    """mx_rec's `create_table`, mapped to `npu_rec.create_table`.

    `device_vocabulary_size` -> `capacity` (fixed, or the starting size under
    `use_dynamic_expansion`); `shard_num` -> `num_shards`; `emb_initializer`
    -> `initializer` (fan-based ones sized from `[device_vocabulary_size,
    dim]`), scaled by `init_param`; an `optimizer_list` keyword (older Rec SDK)
    binds the table's optimizer now. `is_dp`, `all2all_gradients_op`,
    `enable_merge`, `fusion_optimizer_var` and `hashtable_threshold` have no
    meaning in one CPU process and are ignored.

    Tiers: device (HBM) and host (DDR) rows are both process memory here:
    `host_vocabulary_size` adds to the capacity. `ssd_vocabulary_size > 0`
    makes a tiered table (`npu_rec.create_table(memory_rows=, ssd_path=)`):
    `memory_rows = device_vocabulary_size + host_vocabulary_size`, the other
    rows in files under `ssd_data_path` (a directory or a list of them); its
    optimizer must then come with `optimizer_list` (the disk records are laid
    out with the optimizer's slots).

    Raises:
      ValueError: `value_dtype` other than float32, bfloat16 or float16 (the
        rows' storage dtype, `npu_rec.create_table`'s), an SSD tier without
        `ssd_data_path` or `optimizer_list`, `is_save=False`, padding keys, or
        several optimizers.
      TypeError: an unknown keyword.
    """
    optimizer_list = kwargs.pop("optimizer_list", None)
    if kwargs:
        raise TypeError(f"create_table() got unexpected keyword arguments: {sorted(kwargs)}")
    value_dtype = check_value_dtype(value_dtype)
    memory = device_vocabulary_size + (host_vocabulary_size or 0)
    tier = {}
    if ssd_vocabulary_size:
        if not ssd_data_path or not optimizer_list:
            raise ValueError(
                "An SSD tier (`ssd_vocabulary_size` > 0) needs `ssd_data_path` (its "
                "directories) and `optimizer_list` (its records hold the optimizer's slots). "
                f"Received: ssd_vocabulary_size={ssd_vocabulary_size}, "
                f"ssd_data_path={ssd_data_path!r}, optimizer_list={optimizer_list!r}"
            )
        tier = {"memory_rows": memory, "ssd_path": ssd_data_path}
    if not is_save:
        raise ValueError("npu_rec saves every table with its checkpoints. Received: is_save=False")
    if padding_keys is not None or padding_keys_mask or padding_keys_len is not None:
        raise ValueError(
            "Padding keys are not supported. Received: "
            f"padding_keys={padding_keys!r}, padding_keys_mask={padding_keys_mask!r}"
        )
    dim = _dim(dim)
    optimizer = None
    if optimizer_list:
        opts = list(optimizer_list)
        if len(opts) > 1:
            raise ValueError(
                f"A table is trained by one optimizer. Received: optimizer_list of {len(opts)}"
            )
        optimizer = opts[0].sparse_optimizer
    initializer = emb_initializer
    if init_param != 1.0:
        from npu_rec.table import _row_init

        def initializer(shape, dtype=tf.float32):
            rows = _row_init.initial_rows(emb_initializer, shape[0], dim, device_vocabulary_size)
            return rows * init_param

    return HashTable(
        name,
        dim,
        key_dtype,
        initializer,
        memory,
        shard_num,
        optimizer,
        value_dtype=value_dtype,
        tier=tier,
    )


def _ids_of(ids, batch):
    """(ids tensor, access_threshold, eviction_threshold, faae) of a FeatureSpec or tensor."""
    if isinstance(ids, FeatureSpec):
        if batch is None:
            raise ValueError(
                f"A FeatureSpec ids ({ids.name!r}) is read from `batch`. Received: batch=None"
            )
        if ids.index_key not in batch:
            raise ValueError(
                f"`batch` has no column {ids.index_key!r} for FeatureSpec {ids.name!r}. "
                f"Received: batch keys {sorted(batch)}"
            )
        return (
            batch[ids.index_key],
            ids.access_threshold,
            ids.eviction_threshold,
            ids.faae_coefficient,
        )
    return ids, None, None, 1


def sparse_lookup(
    hashtable,
    ids,
    send_count=None,
    is_train=True,
    name=None,
    modify_graph=False,
    batch=None,
    access_and_evict_config=None,
    is_grad=True,
    serving_default_value=None,
    **kwargs,
):
    """mx_rec's `sparse_lookup`, mapped to `npu_rec.sparse_lookup`.

    `ids` is a `FeatureSpec` (its column read from `batch`, its thresholds the
    table's) or an id tensor (thresholds from `access_and_evict_config`).
    The result has the ids' shape plus `[dim]`. A training lookup puts its
    unique-row tensor, rows and unique keys in the collections
    `ASCEND_SPARSE_LOOKUP_LOCAL_EMB`, `..._ID_OFFSET` and `..._UNIQUE_KEYS`;
    from a table's second training lookup (with gradient) on, the table has
    one entry there instead: its sparse variable (see `_TableLookups`) and its
    lookups' rows and unique keys concatenated. Per-example timestamps come
    from the `ASCEND_TIMESTAMP` collection.
    `is_grad=False` stops the gradient (the lookup still admits keys).
    `serving_default_value` ([dim]) replaces the zeros of keys without a row.
    `send_count`, `modify_graph` and the keywords `dim`, `multi_lookup`,
    `feature_spec_name_ids_dict`, `lookup_ids` are accepted and unused.

    Raises:
      ValueError: admission with a `faae_coefficient` other than 1, or a
        FeatureSpec without `batch`.
      TypeError: an unknown keyword.
    """
    for key in ("dim", "multi_lookup", "feature_spec_name_ids_dict", "lookup_ids"):
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"sparse_lookup() got unexpected keyword arguments: {sorted(kwargs)}")
    del send_count, modify_graph
    if not isinstance(hashtable, HashTable):
        raise TypeError(
            f"`hashtable` must come from create_table. Received: hashtable={hashtable!r}"
        )
    tensor, access, evict, faae = _ids_of(ids, batch)
    if access_and_evict_config:
        access = access_and_evict_config.get("access_threshold", access)
        evict = access_and_evict_config.get("eviction_threshold", evict)
        faae = access_and_evict_config.get("faae_coefficient", faae)
    if access is not None and access >= 0 and faae != 1:
        raise ValueError(
            "npu_rec counts every sighting of a key once: admission with a "
            f"faae_coefficient other than 1 is not supported. Received: faae_coefficient={faae}"
        )
    core = hashtable.core_table(access, evict)
    timestamps = None
    if is_train and not tf.executing_eagerly():
        stamps = tf.compat.v1.get_collection(_c.ASCEND_TIMESTAMP)
        if stamps and core.config.eviction:
            timestamps = stamps[-1]
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    before = len(graph.get_collection(npu_rec.LOOKUP_COLLECTION)) if graph is not None else 0
    emb = npu_rec.sparse_lookup(
        core, tensor, is_training=bool(is_train), timestamps=timestamps, name=name
    )
    if graph is not None and is_train:
        records = graph.get_collection(npu_rec.LOOKUP_COLLECTION)[before:]
        if is_grad and len(records) == 1 and isinstance(emb, tf.Tensor):
            emb = _TableLookups.of(graph, core).add(records[0], emb)
        else:
            for rec in records:
                graph.add_to_collection(_c.ASCEND_SPARSE_LOOKUP_LOCAL_EMB, rec.embeddings)
                graph.add_to_collection(_c.ASCEND_SPARSE_LOOKUP_ID_OFFSET, rec.rows)
                graph.add_to_collection(_c.ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS, rec.keys)
                if not is_grad:
                    graph.add_to_collection(_NO_GRAD, rec.embeddings)
    if not is_grad:
        emb = tf.stop_gradient(emb)
    if serving_default_value is not None and (not is_train or core.config.admission):
        emb = _with_default(core, tensor, emb, serving_default_value)
    return emb


_NO_GRAD = "npu_rec_compat_no_grad_lookups"


def _with_default(core, ids, emb, default):
    """`emb` with `default` ([dim]) where an id has no row."""
    ids = tf.convert_to_tensor(ids)
    with tf.control_dependencies([emb]):
        flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
        uniq, idx = tf.unique(flat, out_idx=tf.int64)
        rows = core.find_rows(core.checked_keys(uniq))
    missing = tf.reshape(tf.gather(rows, idx) < 0, tf.shape(ids))[..., None]
    default = tf.cast(tf.reshape(default, [core.dim]), emb.dtype)
    return tf.where(missing, tf.broadcast_to(default, tf.shape(emb)), emb)


_ROUTE_GRADIENT = "NpuRecCompatTableVariableRoute"
#: Graph collection of the `_TableLookups` of a graph (Python objects).
_TABLE_LOOKUPS = "npu_rec_compat_table_lookups"
keep_out_of_meta_graphs(_TABLE_LOOKUPS)
_STAND_IN_COLLECTIONS = (
    (_c.ASCEND_SPARSE_LOOKUP_LOCAL_EMB, "embeddings"),
    (_c.ASCEND_SPARSE_LOOKUP_ID_OFFSET, "rows"),
    (_c.ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS, "keys"),
)


class _TableLookups:
    """The training lookups (with gradient) of one table in one graph, and its sparse variable.

    mx_rec gives a program one sparse variable per table however often the
    table is looked up, and the gradient of the loss with respect to it covers
    every lookup. Here each lookup keeps its own unique-row tensor (npu_rec's
    `LookupRecord`); a table looked up once is represented by that tensor, as
    before. From the second lookup on, the table's sparse variable is
    `variable`, a float [0, dim] stand-in that each lookup's output passes
    through (an identity). The gradient of the loss with respect to it is a
    `tf.IndexedSlices` over the concatenated unique rows of the lookups:
    lookup i's gradient, its indices shifted by the unique rows of the
    lookups before it (`dense_shape` [their total, dim]). The table's entries
    of the `ASCEND_SPARSE_LOOKUP_*` collections become one per table too: the
    variable, and the concatenated rows and unique keys. `split` turns a
    gradient of the variable back into one per lookup, for
    `npu_rec.apply_recorded_gradients`.
    """

    def __init__(self, graph, core):
        self.graph = graph
        self.core = core
        self.records: list = []
        self.variable = None
        self._entries: dict = {}  # collection field -> the table's tensor in that collection
        self._stand_ins: list = []  # every tensor standing for the whole table
        self.routes: dict = {}  # name of a routing op -> (lookup index, the lookup's output)

    @classmethod
    def of(cls, graph, core) -> _TableLookups:
        for table in cls.in_graph(graph):
            if table.core is core:
                return table
        table = cls(graph, core)
        graph.add_to_collection(_TABLE_LOOKUPS, table)
        return table

    @staticmethod
    def in_graph(graph) -> list:
        """The tables looked up for training in `graph`, in the order of their first lookup."""
        return graph.get_collection(_TABLE_LOOKUPS)

    @classmethod
    def of_route(cls, op):
        """(table, lookup index, lookup output) of a routing op."""
        for table in cls.in_graph(op.graph):
            if op.name in table.routes:
                return (table, *table.routes[op.name])
        raise KeyError(op.name)

    @classmethod
    def by_variable(cls, graph, tensor) -> _TableLookups | None:
        """The table looked up several times whose stand-in (variable, rows, keys) is `tensor`."""
        for table in cls.in_graph(graph):
            if any(tensor is t for t in table._stand_ins):
                return table
        return None

    def add(self, rec, emb):
        """Adds a lookup (its record and output); returns the output routed through `variable`."""
        graph = self.graph
        if self.variable is None:
            with tf.init_scope(), graph.name_scope(None):
                self.variable = tf.zeros(
                    [0, self.core.dim],
                    rec.embeddings.dtype,
                    name="sparse_variable_" + re.sub(r"[^A-Za-z0-9_.]", "_", self.core.name),
                )
            self._stand_ins.append(self.variable)
        self.records.append(rec)
        with graph.gradient_override_map({"IdentityN": _ROUTE_GRADIENT}):
            routed = tf.identity_n([emb, self.variable], name="sparse_variable_route")[0]
        self.routes[routed.op.name] = (len(self.records) - 1, emb)
        for name, field in _STAND_IN_COLLECTIONS:
            if len(self.records) == 1:
                new = getattr(rec, field)
                graph.add_to_collection(name, new)
            else:
                if field == "embeddings":
                    new = self.variable
                else:
                    new = tf.concat([getattr(r, field) for r in self.records], 0)
                    self._stand_ins.append(new)
                entries = graph.get_collection_ref(name)
                for i, t in enumerate(entries):
                    if t is self._entries[field]:
                        entries[i] = new
                        break
            self._entries[field] = new
        return routed

    @property
    def sparse_variable(self):
        """The tensor standing for this table in (gradient, variable) pairs."""
        return self.records[0].embeddings if len(self.records) == 1 else self.variable

    def sizes(self) -> list:
        return [tf.size(r.rows, out_type=tf.int64) for r in self.records]

    def split(self, grad) -> list:
        """One dense gradient per lookup from a gradient of `variable` (IndexedSlices or dense)."""
        from npu_rec.table._lookup import densify

        sizes = self.sizes()
        dense = densify(grad, tf.add_n(sizes))
        return tf.split(dense, tf.stack(sizes), num=len(sizes), axis=0)


@tf.RegisterGradient(_ROUTE_GRADIENT)
def _route_gradient(op, grad, _):
    """A routed lookup output's gradients: unchanged to the output, shifted slices to the variable."""
    table, i, out = _TableLookups.of_route(op)
    rec = table.records[i]
    (unique,) = tf.gradients(out, [rec.embeddings], grad_ys=tf.convert_to_tensor(grad))
    if unique is None:
        return [grad, None]
    sizes = table.sizes()
    if not isinstance(unique, tf.IndexedSlices):
        unique = tf.IndexedSlices(unique, tf.range(sizes[i]))
    offset = tf.add_n(sizes[:i]) if i else tf.constant(0, tf.int64)
    shifted = tf.IndexedSlices(
        unique.values,
        tf.cast(unique.indices, tf.int64) + offset,
        tf.stack([tf.add_n(sizes), tf.cast(table.core.dim, tf.int64)]),
    )
    return [grad, shifted]
