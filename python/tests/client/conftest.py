"""One local cluster (real `farpool server` processes) shared by the client tests of a run."""
import pytest

import farpool


@pytest.fixture(scope="session")
def cluster():
    with farpool.LocalCluster(servers=2, memory="128MiB") as c:
        yield c


@pytest.fixture(scope="session")
def pool(cluster):
    return farpool.Pool.connect(cluster.cluster_file)


@pytest.fixture(scope="session")
def db(cluster):
    return farpool.Database.open(cluster=cluster.cluster_file)
