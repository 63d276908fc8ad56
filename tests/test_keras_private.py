"""The private Keras names npu_rec relies on (fenced in `npu_rec._keras_private`) still exist."""

import ast
import pathlib
import sys

import keras
import numpy as np
import tensorflow as tf

from npu_rec import _compat, _keras_private

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_private_keras_name_npu_rec_uses_exists():
    gone = _keras_private.missing()
    assert not gone, (
        f"Keras {keras.__version__} no longer has private names npu_rec relies on: {gone}. "
        "Update npu_rec/_keras_private.py (and its REQUIRED list) for this Keras, or install "
        "the Keras version pinned in setup.cfg."
    )
    assert _keras_private.has_global_state()


def test_missing_names_a_vanished_attribute(monkeypatch):
    monkeypatch.setattr(
        _keras_private,
        "REQUIRED",
        (*_keras_private.REQUIRED, ("keras", "Model._no_such_hook"), ("keras.src.nowhere", "X")),
    )
    assert _keras_private.missing() == ["keras:Model._no_such_hook", "keras.src.nowhere:X"]


def test_no_other_module_imports_keras_src():
    offenders = []
    for path in sorted((ROOT / "npu_rec").rglob("*.py")):
        if path.name == "_keras_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for n in names
                if n.startswith("keras.src")
            ]
    assert not offenders, offenders


# ------------------------------------------------------------ what each accessor returns
def test_the_keras_accessors_read_what_npu_rec_relies_on():
    """Each fenced accessor, on real Keras objects: fails loudly when Keras changes."""
    ids = keras.Input((2,), name="ids")
    dense = keras.Input((3,), name="dense")
    layer = keras.layers.Dense(1, name="head")
    out = layer(keras.layers.Concatenate()([ids, dense]))
    model = keras.Model({"ids": ids, "dense": dense}, out)
    assert _keras_private.producing_layer(out) is layer
    struct = _keras_private.inputs_struct(model)
    assert isinstance(struct, dict) and sorted(struct) == ["dense", "ids"]  # a dict stays one
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert _keras_private.inputs_struct(plain) == plain.inputs
    assert _keras_private.strategy_of(model) is None  # created outside any strategy scope
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        scoped = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert _keras_private.strategy_of(scoped) is strategy
    model.compile(optimizer="sgd", loss="mse")
    assert isinstance(_keras_private.loss_tracker(model), keras.metrics.Mean)
    assert layer in _keras_private.flatten_layers(model)

    data = tf.data.Dataset.from_tensor_slices(
        ({"ids": np.zeros((4, 2), np.float32), "dense": np.zeros((4, 3), np.float32)}, np.ones(4))
    ).batch(2)
    iterator = _keras_private.TFEpochIterator(
        distribute_strategy=tf.distribute.get_strategy(), x=data, steps_per_epoch=1
    )
    assert _keras_private.iterator_element_spec(iterator) == data.element_spec


def test_the_symbolic_build_builds_a_compiled_models_state():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32))
    _keras_private.symbolic_build(model, spec)
    assert model.optimizer.built and len(model.optimizer.variables) > 1


def test_the_overridden_keras_hooks_are_the_listed_ones():
    """npu_rec classes that override a private Keras method: each is in `HOOKS` and `REQUIRED`."""
    import npu_rec.keras  # noqa: F401 (the classes below)

    overridden = set()
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("npu_rec.") or module is None:
            continue
        for obj in vars(module).values():
            if not (isinstance(obj, type) and obj.__module__ == module_name):
                continue
            if not issubclass(obj, keras.layers.Layer):
                continue
            for base_name in ("Model", "Layer"):
                base = getattr(keras, base_name) if base_name == "Model" else keras.layers.Layer
                for name in vars(obj):
                    private = name.startswith("_") and not name.startswith("__")
                    if private and hasattr(base, name) and issubclass(obj, base):
                        overridden.add(f"{base_name}.{name}")
    # A hook of Layer is also one of Model: keep the most general base.
    overridden = {
        h for h in overridden if not (h.startswith("Model.") and f"Layer.{h[6:]}" in overridden)
    }
    instance_hooks = set(_keras_private.INSTANCE_HOOKS)
    assert instance_hooks <= set(_keras_private.HOOKS)
    assert overridden == set(_keras_private.HOOKS) - instance_hooks
    required = {path for module, path in _keras_private.REQUIRED if module == "keras"}
    assert set(_keras_private.HOOKS) <= required


def test_the_optimizer_applies_what_its_gradient_reduction_returns():
    """`gradients_already_reduced` skips the reduction `apply_gradients` makes, and only there."""
    variable = keras.Variable(np.ones(2, np.float32))
    optimizer = keras.optimizers.SGD(learning_rate=1.0)
    seen = []

    def doubled(grads_and_vars):  # what Keras' reduction returns is what gets applied
        seen.append(list(grads_and_vars))
        return [(2.0 * g, v) for g, v in seen[-1]]

    object.__setattr__(optimizer, "_all_reduce_sum_gradients", doubled)
    optimizer.apply_gradients([(tf.constant([1.0, 2.0]), variable)])
    assert len(seen) == 1 and seen[0][0][1] is variable.value
    np.testing.assert_allclose(variable.numpy(), [-1.0, -3.0])
    object.__delattr__(optimizer, "_all_reduce_sum_gradients")

    inner = keras.optimizers.SGD(learning_rate=1.0)
    scaled = keras.optimizers.LossScaleOptimizer(inner, initial_scale=1.0)
    calls = []
    for opt in (optimizer, inner, scaled):
        original = opt._all_reduce_sum_gradients
        object.__setattr__(
            opt, "_all_reduce_sum_gradients", lambda gv, o=original: calls.append(1) or o(gv)
        )
    with _keras_private.gradients_already_reduced(scaled):
        scaled.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
        optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
    assert calls == [1]  # only the optimizer outside the context reduced
    np.testing.assert_allclose(variable.numpy(), [-3.0, -5.0])
    scaled.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
    assert calls == [1, 1]  # the inner optimizer's own reduction is back


def test_fit_calls_the_models_train_function_with_the_epochs_iterator():
    """The contract `RecModel`'s own multi-worker train function relies on."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    calls = []

    def function(iterator):
        assert isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator))
        x, _ = iterator.get_next()  # raises OutOfRangeError at the end of the data
        calls.append(float(tf.reduce_sum(x)))
        return {"seen": tf.constant(float(len(calls)))}  # not a metric's name: kept as given

    model.make_train_function = lambda force=False: setattr(model, "train_function", function)
    data = tf.data.Dataset.from_tensor_slices((np.arange(6.0)[:, None], np.zeros(6))).batch(2)
    data = data.filter(lambda x, y: True)  # unknown length: the end comes from the iterator
    batches = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_logs.append(logs["seen"])
    )
    batch_logs = []
    history = model.fit(data, epochs=2, verbose=0, callbacks=[batches])
    assert calls == [1.0, 5.0, 9.0] * 2
    assert batch_logs == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert history.history["seen"] == [3.0, 6.0]


# ------------------------------------------------------------ TensorFlow's private names
def test_the_tensorflow_accessors_read_what_npu_rec_relies_on():
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", [2])
        w = tf.compat.v1.get_variable("w", [2])
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        _compat.create_v1_slots(opt, [v])
        assert opt.get_slot(v, "m") is not None and opt.get_slot(w, "m") is None
        _compat.create_v1_slots(keras.optimizers.Adam(0.1), [w])  # not a v1 optimizer: nothing
        table = tf.compat.v1.get_variable("rows", initializer=tf.ones([3, 2]))
        grad = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([0, 0]), tf.constant([3, 2]))
        sgd = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        update = _compat.v1_apply_sparse_rule(sgd, grad, table)  # duplicates summed: 1 - 0.5*2
        session = tf.compat.v1.Session(graph=graph)
        assert not _compat.session_is_closed(session)
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(update)
        np.testing.assert_allclose(session.run(table), [[0, 0], [1, 1], [1, 1]])
        session.close()
        assert _compat.session_is_closed(session)
    fn = tf.function(lambda x: x)
    assert hasattr(fn, "_omit_frequent_tracing_warning")
    _compat.quiet_retracing(fn)
    assert fn._omit_frequent_tracing_warning is True
    error = ValueError("x")
    assert _compat.shown_as_raised(error) is error


def test_the_graph_accessors_rewire_an_input_and_see_v1_control_flow():
    graph = tf.Graph()
    with graph.as_default():
        one, two = tf.constant([1.0]), tf.constant([2.0])
        out = tf.identity(one)
        _compat.rewire_input(out.op, 0, two)
        assert list(out.op.inputs) == [two]
        assert not _compat.in_control_flow(graph)
        inside = []
        was_v2 = tf.compat.v1.control_flow_v2_enabled()
        tf.compat.v1.disable_control_flow_v2()  # a v1 cond: a control-flow context
        try:
            tf.cond(
                tf.constant(True),
                lambda: inside.append(_compat.in_control_flow(graph)) or one,
                lambda: two,
            )
        finally:
            if was_v2:
                tf.compat.v1.enable_control_flow_v2()
        assert inside == [True]
        with tf.compat.v1.Session(graph=graph) as session:
            assert session.run(out).tolist() == [2.0]


def test_the_key_maps_tensorflow_private_members_exist():
    from npu_rec._kernels import _key_map

    table = tf.lookup.experimental.DenseHashTable(
        tf.int64, tf.int64, default_value=-1, empty_key=-1, deleted_key=-2, name="probe"
    )
    gone = [n for n in _key_map.TF_PRIVATE if not hasattr(table, n)]
    assert not gone, f"TensorFlow {tf.__version__}'s DenseHashTable no longer has {gone}"


# ------------------------------------------------------------ no private name outside the fences
#: The modules allowed to use Keras' and TensorFlow's private names, each with its list.
FENCES = (
    "npu_rec/_keras_private.py",
    "npu_rec/_compat.py",
    "npu_rec/distribute/_tf_private.py",
    "npu_rec/_kernels/_key_map.py",
)


def _private_names_defined_by_npu_rec(trees) -> set[str]:
    """`_names` npu_rec defines: functions, classes, parameters, module names, `self._x = `."""
    defined = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
                args = node.args
                defined.update(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
            elif isinstance(node, ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                defined.add(node.attr)
            elif isinstance(node, ast.alias):
                defined.add(node.asname or node.name.split(".")[0])
    return defined


#: A namedtuple's public methods carry a leading underscore (so fields cannot clash).
NAMEDTUPLE_API = frozenset({"_asdict", "_replace", "_fields", "_make", "_field_defaults"})
#: Documented public constants of other libraries whose names start with "_" (librdkafka's
#: client-side error codes, e.g. confluent_kafka.KafkaError._PARTITION_EOF).
OTHER_LIBRARIES_PUBLIC = frozenset({"_PARTITION_EOF"})


def private_names_used_outside_the_fences(root=ROOT) -> list[str]:
    """ "path:line: name" of each private attribute npu_rec reads or writes outside the fences
    without defining it (so a Keras or TensorFlow one), including `getattr(x, "_name")`."""
    trees = {
        p.relative_to(root).as_posix(): ast.parse(p.read_text())
        for p in sorted((root / "npu_rec").rglob("*.py"))
    }
    own = _private_names_defined_by_npu_rec(trees)
    found = []
    for rel, tree in trees.items():
        if rel in FENCES:
            continue
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                name = node.args[1].value
            if name in NAMEDTUPLE_API or name in OTHER_LIBRARIES_PUBLIC:
                continue
            if name and name.startswith("_") and not name.startswith("__") and name not in own:
                found.append((rel, node.lineno, name))
    return [f"{rel}:{line}: {name}" for rel, line, name in sorted(found)]


def test_no_private_keras_or_tensorflow_name_is_used_outside_the_fences():
    found = private_names_used_outside_the_fences()
    assert not found, (
        "private Keras/TensorFlow names used outside npu_rec/_keras_private.py and "
        f"npu_rec/_compat.py (move each behind an accessor there, with a test): {found}"
    )


def test_the_fence_check_sees_private_names(tmp_path):
    pkg = tmp_path / "npu_rec"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "def f(model, opt):\n"
        "    opt._create_slots([])\n"
        "    return getattr(model, '_inputs_struct', None)\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def g(self, other):\n"
        "        return other._mine + self._distribute_strategy\n"
    )
    assert private_names_used_outside_the_fences(tmp_path) == [
        "npu_rec/a.py:2: _create_slots",
        "npu_rec/a.py:3: _inputs_struct",
        "npu_rec/a.py:8: _distribute_strategy",
    ]
